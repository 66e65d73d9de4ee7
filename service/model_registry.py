"""The models a server holds, and which one answers a request that names none."""

from __future__ import annotations

from bertserve.service.errors import ModelNotFound, TaskUnavailable
from bertserve.service.served_model import ServedModel
from bertserve.service.tasks import Task


class ModelRegistry:
    def __init__(self, models: list[ServedModel]):
        self.ordered = list(models)  # the order of the `models` setting, else by name
        self.by_name = {m.name: m for m in models}
        # The default for a task: the first model (in order) that has it.
        self.defaults: dict[Task, ServedModel] = {}
        for model in self.ordered:
            for task in model.tasks:
                self.defaults.setdefault(task, model)
        # Attention: the first model (in order) whose repository holds the encoder_attentions graph.
        self.attention_default = next((m for m in self.ordered if m.attention is not None), None)

    def resolve(self, name: str, task: Task | None) -> ServedModel:
        """The named model, or the default for `task` (None: any model, e.g. for Tokenize)."""
        if name:
            model = self.by_name.get(name)
            if model is None:
                known = ", ".join(self.by_name)
                raise ModelNotFound(f"model: no model named {name[:64]!r} is loaded (loaded: {known})")
            if task is not None and task not in model.tasks:
                have = ", ".join(t.value for t in model.tasks) or "none"
                raise TaskUnavailable(f"model {name}: has no {task.value} task (tasks: {have})")
            return model
        if task is None:
            return self.ordered[0]
        model = self.defaults.get(task)
        if model is None:
            raise TaskUnavailable(f"model: no loaded model has a {task.value} task")
        return model

    def resolve_attention(self, name: str) -> ServedModel:
        """The named model, or the default for Attention; it must have the encoder_attentions graph."""
        model = self.resolve(name, None) if name else self.attention_default
        if model is None:
            raise TaskUnavailable(
                "model: no loaded model has an encoder_attentions graph (export one with --attentions)"
            )
        if model.attention is None:
            raise TaskUnavailable(
                f"model {model.name}: has no encoder_attentions graph, which Attention needs "
                "(export it with `bertserve export --attentions`)"
            )
        return model

    def default_rpcs(self, model: ServedModel) -> list[str]:
        rpc = {Task.EMBED: "Embed", Task.FILL_MASK: "FillMask", Task.CLASSIFY: "Classify"}
        names = [rpc[t] for t, m in self.defaults.items() if m is model]
        if model is self.ordered[0]:
            names.append("Tokenize")
        if model is self.attention_default:
            names.append("Attention")
        return names
