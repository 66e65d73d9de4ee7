"""Training code the server never runs, the distribution bertserve-train (train/pyproject.toml): the
WordNet heads (heads/, `bertserve train-heads`, `assemble-heads`) and the masked-LM pretraining
(pretrain/, `bertserve pretrain`, `pack-pretrained`, `assemble-pretrained`). What they commit lives in
export/heads/weights and export/pretrain/weights, read by `bertserve export-default-heads`."""
