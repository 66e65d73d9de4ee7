"""The `bertserve` subcommands of this package: the client's (embed, fill-mask, classify, rerank, tokenize, info,
attention, embed-file), which talk to a running server through bertserve/client.py and never import the
server package (bertserve.service), and `serve` (serve.py), which imports the server package only when
`bertserve serve` is chosen. The server package imports none of them."""
