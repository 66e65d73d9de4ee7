"""The committed masked-LM pretraining of the default fill-mask model: weights/ and output.py (the
checkpoint format, and its assembly onto the base model). The training is bertserve.train.pretrain
(`bertserve pretrain`, the distribution bertserve-train)."""
