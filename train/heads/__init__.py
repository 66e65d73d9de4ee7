"""Training the WordNet heads on the frozen default encoder: training.py (the run), wordnet.py (the data),
features.py, classifier.py and mlm.py (the two heads), commands.py (`bertserve train-heads`,
`assemble-heads`)."""
