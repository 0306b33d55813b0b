"""DCR end to end: `python examples/run_dcr.py` runs the tiny preset on the toy world on a CPU in minutes.

Both stages (projector alignment, then LoRA on the encoder), the exports (a plain transformers vision tower,
the
DCRModel, the base CLIP with the enhanced tower in final/), and a before/after table of D-ability (zero-shot
clustering) and P-ability (MMVP-style pairs). Any flag of `hf-vrl train dcr` works here, e.g.
`--config dcr-openai-l14-224 --dataset webdataset:/data/cc3m/{00000..00331}.tar`.
"""

import sys

from hf_vrl.run import main

if __name__ == "__main__":
    sys.exit(main("dcr", sys.argv[1:]))
