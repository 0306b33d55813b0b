"""hf_vrl's encoders inside other stacks.

`llava`: put an enhanced vision tower (DCR / DiVE export, DiffCLIP tower, CLUE ViT backbone) into
transformers' `LlavaForConditionalGeneration` (`hf-vrl export-llava`); `llava_align`: relearn LLaVA's
projector with trl's `SFTTrainer` when the tower does not fit it (`hf-vrl llava-align`).
"""
