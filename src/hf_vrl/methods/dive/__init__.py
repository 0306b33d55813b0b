"""DiVE (Difference Vector Equalization, Suzuki et al., AAAI 2026): robust fine-tuning of CLIP-like models
that keeps the pre-trained embedding geometry, with its baselines (FLYP, FLYP + replay, SnD, the cosine
constraint, WiSE-FT, vanilla FT, LP-FT). Method code, not Hub-facing: the result is a plain CLIPModel /
SiglipModel / DiffCLIP (for vanilla FT and LP-FT with their head beside it).

loss.py          difference vectors, AVL, PVL, the moving average m (Eq. 4-8), cosine variant, SnD (Eq. 12)
sigmoid_loss.py  SigLIP's sigmoid loss (FLYP and DiVE on SiglipModel)
settings.py      DiVESettings: the `dive` section of a run configuration (paper defaults)
data.py          FLYP captions from class templates, the reference batches (ReferenceLoader)
frozen.py        the frozen pre-trained model: forward without gradient or a cache of its embeddings
trainer.py       DiVETrainer (ContrastiveTrainer subclass): every objective, m and the reference position
                 in the training state
ensemble.py      WiSE-FT weight interpolation with the coefficient chosen on validation data
head.py          vanilla FT / LP-FT: a zero-shot-initialised linear head on the image tower, HeadTrainer (CE)
evaluate.py      ID / OOD (top-1, macro F1, worst group) / zero-shot / RSA as the paper reports them
export.py        the result as a plain CLIPModel and CLIPVisionModel
shifts.py        style shifts (inverted, blurred, re-coloured) that make OOD test sets of the embedded data
model.py         load the dual encoder to fine-tune (Hub id, checkpoint, config-only preset) in float32
method.py        `hf-vrl train dive` on the shared run design (presets dive-tiny, dive-b16; demo part)
The objectives are public in hf_vrl.losses.
"""
