"""The WordNet heads of the default encoder, as committed: weights/ (a masked-LM head and a noun category
classifier) and assemble.py (committed weights -> checkpoints). Their training is bertserve.train.heads
(the distribution bertserve-train)."""
