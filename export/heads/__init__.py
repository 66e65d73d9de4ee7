"""Heads for the default encoder trained offline on WordNet: a masked-LM head (fill-mask) and a noun
category classifier. See training.py (the run), assemble.py (committed weights -> checkpoints)."""
