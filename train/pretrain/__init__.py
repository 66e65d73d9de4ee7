"""Masked-language-model pretraining of the scratch BERT (`bertserve pretrain`)."""
