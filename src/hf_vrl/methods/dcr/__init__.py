"""DCR (Diffusion Contrastive Reconstruction, arXiv 2603.04803): method code that is not Hub-facing.

loss.py       dcr_loss (Eq. 12) and the baselines' objectives (Eq. 7-9, 11)
diffusion.py  the frozen SD UNet/VAE/scheduler (load_diffusion, tiny_diffusion)
unet_split.py the UNet split at its first cross-attention (prefix once per noisy latent)
memory.py     live-tensor accounting, the automatic UNet chunk size
augment.py    the positive view a(x) in torch
task.py       DCRTask: trainable DCRModel + frozen diffusion + objective -> {"loss", metrics}; DCRCollator
trainer.py    DCRTrainer, prepare_stage (stage 1 projector / stage 2 LoRA / end-to-end)
export.py     merge LoRA, save a plain transformers vision tower
evaluate.py   before/after D-ability (clustering) and P-ability (MMVP-style)
toy.py        the tiny CLIP and tiny SD of the toy world
lean_unet.py  the frozen UNet keeping only what the backward pass to the condition needs
method.py     `hf-vrl train dcr`: its run configuration and Method (stages, toy inputs, exports)
paper.py      the paper's Tables 1, 2, 3 and 6 as data (examples/reproduce_dcr.py)
The Hub-facing model (DCRConfig, DCRModel) lives in hf_vrl.models.dcr; the objectives are public in
hf_vrl.losses.
"""
