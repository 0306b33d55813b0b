"""The transformers versions a published hf_vrl model with remote code supports (stated on its card)."""

# pip specifier; the remote-code models (DiffCLIP, DCRModel, CLUEModel) are checked on 4.57 and 5.x
REMOTE_CODE_TRANSFORMERS = ">=4.57,<6"
