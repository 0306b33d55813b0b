"""Publishing to the Hugging Face Hub: a run's model with its processors, remote code and model card, in one
commit (`publish`, `hf-vrl push`); the card alone (`build_model_card`). Cards are the method templates in
`model_cards/`, filled from the run's config.json and report.json.
"""

from hf_vrl.hub.card import build_model_card
from hf_vrl.hub.publish import Publication, publish
from hf_vrl.hub.versions import remote_code_transformers

__all__ = ["Publication", "build_model_card", "publish", "remote_code_transformers"]
