"""The client's subcommands of `bertserve` (embed, fill-mask, classify, tokenize, info, attention,
embed-file): they talk to a running server through bertserve/client.py and never import the server
package (bertserve.service), which keeps only its own commands (serve)."""
