"""Per-paper method code (conversion, losses, trainers); import the submodule you need, e.g.
`hf_vrl.methods.diffclip`."""
