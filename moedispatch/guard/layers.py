"""Per-layer checks inside an engine (issue 24 item 3), engine-agnostic: moedispatch's model of the launch's MoE
layers and its prediction of what the engine release picks and allocates for each, to compare with what the engine
really did. A difference is the alarm "moedispatch's model of <engine> X is stale here" — the peer suite
(tests/peers) running in production.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from moedispatch.engines import lint
from moedispatch.engines.choice import EngineChoice, choice_for_layer
from moedispatch.guard.process0 import PREFIX
from moedispatch.probe.targets import resolve_capabilities
from moedispatch.sources.models import expand_layers

__all__ = ["LayerModel", "layer_index", "stale_pick", "stale_allocation"]

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def layer_index(name: str) -> int | None:
    """The decoder-layer index in an engine's module name (``model.layers.12.mlp.experts`` → 12)."""
    m = _LAYER_INDEX.search(str(name))
    return int(m.group(1)) if m else None


class LayerModel:
    """moedispatch's per-rank MoE layers of one launch (``argv`` as :func:`moedispatch.guard.process0.launch_argv`
    writes it, ``spec`` the model) on ``target``, with the engine release's predicted pick per layer (memoized)."""

    def __init__(self, engine: str, version: str, argv: Sequence[str], spec: Any, env: Mapping[str, str],
                 target: str | None) -> None:
        launch = lint.parse_launch(None, list(argv), {}, dict(env))
        tp, ep, _attention_tp = lint._plan_layout(launch)   # the MoE layers at the MoE's own TP
        self.engine, self.version, self.env = engine, version, dict(env)
        self.caps, _ = resolve_capabilities(target, None)
        self.quant_method = spec.quant_method
        self.layers = {lay.index: lay for lay in expand_layers(spec, tp, ep) if lay.kind == "moe"}
        self._choices: dict[tuple, EngineChoice] = {}

    def layer(self, name: str) -> Any:
        """The modelled MoE layer an engine module name refers to, or None."""
        index = layer_index(name)
        return None if index is None else self.layers.get(index)

    def predict(self, layer: Any, moe_backend: str) -> EngineChoice:
        key = (layer.hidden, layer.intermediate, layer.experts, moe_backend)
        if key not in self._choices:
            self._choices[key] = choice_for_layer(layer, self.caps, self.engine, self.version, env=self.env,
                                                  moe_backend=moe_backend, quant_method=self.quant_method)
        return self._choices[key]


def stale_pick(engine: str, name: str, layer: Any, picked: str, choice: EngineChoice) -> str | None:
    """The alarm line when the engine's real pick is not the predicted one (None when they agree)."""
    if choice.backend == picked:
        return None
    return (f"{PREFIX}: STALE — moedispatch's model of {_NAMES[engine]} {choice.version} is stale here: layer {name} "
            f"(hidden {layer.hidden}, intermediate/rank {layer.intermediate_per_rank}): {_NAMES[engine]} picked "
            f"{picked}, moedispatch predicted {choice.backend or 'a refusal: ' + str(choice.error)}; its verdict on "
            "this launch cannot be trusted — please report it with both values")


def stale_allocation(engine: str, name: str, got: tuple[int, int], choice: EngineChoice) -> str | None:
    """The alarm line when the engine allocated other padded sizes than predicted (None when they agree)."""
    want = (choice.hidden, choice.intermediate_per_rank)
    if not choice.ok or got == want:
        return None
    return (f"{PREFIX}: STALE — moedispatch's model of {_NAMES[engine]} {choice.version} is stale here: layer {name}: "
            f"{_NAMES[engine]} allocated hidden {got[0]} × intermediate/rank {got[1]}, moedispatch predicted "
            f"{want[0]} × {want[1]}")
