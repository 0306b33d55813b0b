"""CLUE (fine-grained self-supervised learning with multi-level clustering regularisation): method code
that is not Hub-facing.

loss.py       sinkhorn, soft_info_nce (Eq. 4-6), text_alignment_loss (Eq. 7), clue_objective (Eq. 8)
augment.py    ReSA's weak and strong views, CLUECollator (randomness from the `sample_seed` column)
text.py       descriptions -> frozen CLIP text embeddings, encoded once and cached (TextBank)
describe.py   the three-step VLM description generator (batched, resumable JSON)
trainer.py    CLUETrainer: two views, both branches, Eq. 8, the momentum update and its schedules
model.py      build a CLUEModel from a ResNet/ViT checkpoint, a CLUE checkpoint or a config; image processor
evaluate.py   linear probe, retrieval Rank-1/5, granularity metrics (CDNV, NCC), Fig. 6 part maps
export.py     the trained backbone as a plain ResNetModel / ViTModel
settings.py   CLUESettings = the model and clue sections of a run (CLUEModelFields, CLUEMethodFields)
method.py     `hf-vrl train clue`: CLUERunConfig, CLUEMethod on the shared run design
miniature.py  the ablation ladder (Table 2 rows, the shuffled-text control, Table 3's K) as runs; toy
              pretraining of the backbone and the text encoder
toy_describer.py  the miniature's label-blind descriptions (from pixels, with errors and omissions)
paper.py      the paper's Table 2 and 3 numbers (examples/reproduce_clue.py prints them beside ours)
The Hub-facing model (CLUEConfig, CLUEModel, the VLAD layer) lives in hf_vrl.models.clue; the objectives are
public in hf_vrl.losses.
"""
