"""veRL's AgentLoop API: what a user writes to drive the rollout servers sample by sample.

An agent loop is a class with ``async run(sampling_params, **kwargs) -> AgentLoopOutput`` (or a list of them: a
multi-output session); ``kwargs`` are the sample's dataset fields (``raw_prompt``, ``raw_prompt_ids``, ``index``,
``tools_kwargs``, ``extra_info``, …). It talks to the servers through
``self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` and is registered by name —
``@register("my_agent")`` in code, or a YAML list (``name`` + ``_target_``) at ``rollout.agent.agent_loop_config_path``
— and chosen per sample by the ``agent_name`` column (default ``rollout.agent.default_agent_loop``). One instance is
built per sample with veRL's constructor
``(trainer_config, server_manager, tokenizer, processor, dataset_cls, dataset_config, **kwargs)``.

The workers that run the loops and the manager that splits a batch over them are
:class:`~verl.experimental.agent_loop.worker.AgentLoopWorker` and
:class:`~verl.experimental.agent_loop.manager.AgentLoopManager` (importable from here too, as in veRL).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from verl.utils.token_ids import as_token_ids

__all__ = [
    "AgentLoopBase",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "DictConfigWrap",
    "ToolListWrap",
    "agent_loop_target",
    "default_agent_loop",
    "load_agent_loop_configs",
    "register",
    "registered_agent_loops",
]

logger = logging.getLogger(__name__)


class AgentLoopMetrics(BaseModel):
    """Per-sample timings of a loop: seconds in ``generate`` calls and in tool calls, and preemptions."""

    model_config = ConfigDict(extra="allow")

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = 0


_TEACHER_FIELDS = ("teacher_ids", "teacher_logprobs")


class AgentLoopOutput(BaseModel):
    """What ``run`` returns for one sample (veRL's fields).

    Args:
        prompt_ids: the prompt's token ids.
        response_ids: every token after the prompt: the model's and (multi-turn) tool / user tokens.
        response_mask: 1 on tokens the model generated, 0 on the others (same length as ``response_ids``).
        response_logprobs: the rollout's log-probability of each response token (0 where the mask is 0).
        routed_experts: MoE routing (not used by our engines).
        multi_modal_data: images / videos of the conversation.
        reward_score: the loop's own score of the trajectory; when set, the reward function is not called for it.
        num_turns: chat turns (user, assistant and tool).
        metrics: an :class:`AgentLoopMetrics` or a dict of its fields.
        extra_fields: anything else, passed on per sample as non-tensor columns (the batch always has the columns
            ``turn_scores``, ``tool_rewards``, ``min_global_steps``, ``max_global_steps`` and ``extras``, None where
            a sample has no value, so that batches of different loops concatenate).
        mm_processor_kwargs: kwargs of the multi-modal processor that rollout and training must share (veRL's; None
            for text models, the only ones our engines serve).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics = Field(default_factory=AgentLoopMetrics)
    extra_fields: dict[str, Any] = Field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (values not copied); ``teacher_ids`` / ``teacher_logprobs`` of ``extra_fields`` move
        to the top level (veRL 0.10's distillation columns). The model itself is not changed."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        extra = dict(self.extra_fields)
        for key in _TEACHER_FIELDS:
            if key in extra:
                fields[key] = extra.pop(key)
        fields["extra_fields"] = extra
        return fields

    @field_validator("prompt_ids", mode="before")
    @classmethod
    def _prompt_token_ids(cls, value: Any) -> list[int]:
        """A tokenizer's ``BatchEncoding`` (``apply_chat_template(tokenize=True)``) counts as its ``input_ids``."""
        return as_token_ids(value, "AgentLoopOutput.prompt_ids")

    @model_validator(mode="after")
    def _check_lengths(self) -> AgentLoopOutput:
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError(
                f"AgentLoopOutput: response_mask has {len(self.response_mask)} entries for "
                f"{len(self.response_ids)} response_ids"
            )
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(
                f"AgentLoopOutput: response_logprobs has {len(self.response_logprobs)} entries for "
                f"{len(self.response_ids)} response_ids"
            )
        return self


class DictConfigWrap:
    """A config handed to an agent loop, read as ``.config`` (veRL wraps it so ``hydra.utils.instantiate`` leaves it
    alone)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.cache: dict[str, Any] = {}  # what loops derive from the config once (OmegaConf reads are slow)


_DummyConfig = DictConfigWrap  # veRL's older name


class ToolListWrap:
    """A list of tools handed to an agent loop's constructor (``tools=``), wrapped so that ``hydra.utils.instantiate``
    leaves the tool objects alone (veRL's)."""

    def __init__(self, tools: list[Any]) -> None:
        self.tools = list(tools)


def _unwrap(config: Any) -> Any:
    return config.config if isinstance(config, DictConfigWrap) else config


class AgentLoopBase(ABC):
    """Base class of agent loops (one instance per sample).

    Args:
        trainer_config: the whole trainer config, wrapped (``DictConfigWrap``; read as ``self.config``).
        server_manager: the :class:`AsyncLLMServerManager` (``await server_manager.generate(...)``).
        tokenizer / processor: the policy's tokenizer and processor (None for text models).
        dataset_cls: the dataset class (``data.custom_cls`` or ``RLHFDataset``).
        dataset_config: the ``data`` config, wrapped (veRL's newer name ``data_config`` is accepted too).
        **kwargs: extra keys of the loop's YAML entry (also given to :meth:`init_class`).
    """

    _class_initialized = False

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any = None,
        dataset_cls: type | None = None,
        dataset_config: Any = None,
        data_config: Any = None,
        **kwargs: Any,
    ) -> None:
        self.config = _unwrap(trainer_config)
        self._wrap = trainer_config if isinstance(trainer_config, DictConfigWrap) else DictConfigWrap(self.config)
        data_wrap = dataset_config if dataset_config is not None else data_config

        def views() -> tuple[Any, Any, dict[str, Any]]:
            data = _unwrap(data_wrap)
            if data is None:
                data = self.config.get("data") or OmegaConf.create({})
            return data, self.config.actor_rollout_ref.rollout, dict(data.get("apply_chat_template_kwargs") or {})

        data, self.rollout_config, self.apply_chat_template_kwargs = self.cached(("views", id(data_wrap)), views)
        self.data_config = self.dataset_config = data
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.loop = asyncio.get_running_loop()
        self._system_prompt: list[int] | None = None
        self.init_class(config=self.config, tokenizer=tokenizer, processor=processor, **kwargs)

    def cached(self, key: Any, compute: Any) -> Any:
        """``compute()``, once per trainer config (the worker builds a loop per sample from the same config)."""
        cache = self._wrap.cache
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
        """Heavy set-up shared by every instance of the class (runs once per class and process)."""
        if cls._class_initialized:
            return
        cls._class_initialized = True

    async def process_vision_info(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """``{"images": …, "videos": …}`` of a conversation (empty for text models: no processor)."""
        if self.processor is None:
            return {}
        process = getattr(self.dataset_cls, "process_vision_info", None)
        if process is None:
            raise NotImplementedError(
                f"{type(self).__name__}.process_vision_info: the dataset class {self.dataset_cls!r} has no "
                "process_vision_info (multi-modal data is not supported by this dataset)"
            )
        images, videos = await process(messages, config=self.data_config)
        return {k: v for k, v in (("images", images), ("videos", videos)) if v is not None}

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        images: Any = None,
        videos: Any = None,
        remove_system_prompt: bool = False,
    ) -> list[int]:
        """Prompt token ids of ``messages`` (generation prompt added; ``data.apply_chat_template_kwargs`` applied).
        ``remove_system_prompt`` drops the template's default system prefix (for appending a turn)."""
        if images is not None or videos is not None:
            raise NotImplementedError("apply_chat_template: multi-modal prompts are not supported by our engines")
        kwargs = {"add_generation_prompt": True, **self.apply_chat_template_kwargs, "tokenize": True}
        ids = await self.loop.run_in_executor(
            None,
            lambda: as_token_ids(
                self.tokenizer.apply_chat_template(list(messages), tools=tools, **kwargs), "chat template"
            ),
        )
        if remove_system_prompt:
            if self._system_prompt is None:
                self._system_prompt = self.cached("system_prompt", self._default_system_prompt)
            if ids[: len(self._system_prompt)] == self._system_prompt:
                ids = ids[len(self._system_prompt) :]
        return ids

    def _default_system_prompt(self) -> list[int]:
        """What the template renders for an empty conversation (its default system turn); [] if it cannot."""
        empty = {**self.apply_chat_template_kwargs, "add_generation_prompt": False, "tokenize": True}
        try:
            return as_token_ids(self.tokenizer.apply_chat_template([{}], **empty), "apply_chat_template")
        except Exception:  # noqa: BLE001 - a template that needs a role or content has no default system turn
            return []

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run one sample; ``kwargs`` are its dataset fields. Returns its output, or several (veRL 0.10's multi-output
        sessions: a row each, the final output last, its reward every output's)."""


# name → the hydra config that builds the loop ({"_target_": "module.Class", ...extra constructor kwargs})
_agent_loop_registry: dict[str, dict[str, Any]] = {}


def register(agent_name: str):
    """Class decorator: make an :class:`AgentLoopBase` subclass available as ``agent_name``."""

    def decorator(subclass: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


def registered_agent_loops() -> list[str]:
    """The registered agent-loop names."""
    _load_builtin()
    return sorted(_agent_loop_registry)


def agent_loop_target(agent_name: str) -> dict[str, Any]:
    """The hydra config of a registered loop, or a ``ValueError`` naming the registered ones."""
    _load_builtin()
    if agent_name not in _agent_loop_registry:
        raise ValueError(
            f"agent loop {agent_name!r} is not registered (the agent_name column or "
            f"rollout.agent.default_agent_loop); registered: {sorted(_agent_loop_registry)} — register one with "
            "@register(name) or list it in rollout.agent.agent_loop_config_path"
        )
    return _agent_loop_registry[agent_name]


def default_agent_loop(rollout: Any) -> str:
    """The loop of samples without an ``agent_name`` column: ``rollout.agent.default_agent_loop``, except that
    ``rollout.multi_turn.enable=True`` turns the default ``single_turn_agent`` into ``tool_agent``."""
    name = str(rollout.agent.default_agent_loop)
    if rollout.multi_turn.enable and name == "single_turn_agent":
        return "tool_agent"
    return name


def load_agent_loop_configs(path: str) -> list[str]:
    """Register the loops listed in the YAML file ``path`` (a list of ``{name, _target_, ...}``); returns their
    names. Each target is imported now, so a wrong entry fails at start-up naming the file and entry."""
    import hydra.utils

    from verl.utils.config import load_yaml_file

    where = f"rollout.agent.agent_loop_config_path={path!r}"
    entries = load_yaml_file(path, where)
    if not isinstance(entries, ListConfig):
        raise ValueError(f"{where}: must hold a list of {{name, _target_}} entries, got a {type(entries).__name__}")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, DictConfig) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"{where}: entry {i} needs 'name' and '_target_', got {entry!r}")
        target = str(entry["_target_"])
        try:
            cls = hydra.utils.get_class(target)
        except Exception as e:  # noqa: BLE001 - hydra wraps import errors in several types
            raise ImportError(f"{where}: entry {i} ({entry['name']}): cannot import {target!r}: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise TypeError(f"{where}: entry {i} ({entry['name']}): {target} is not an AgentLoopBase subclass")
        config = OmegaConf.to_container(entry, resolve=True)
        name = str(config.pop("name"))
        _agent_loop_registry[name] = config
        names.append(name)
    return names


def _load_builtin() -> None:
    import verl.experimental.agent_loop.single_turn_agent_loop  # noqa: F401 - registers single_turn_agent
    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401 - registers tool_agent


def __getattr__(name: str) -> Any:
    """veRL's import paths: the worker, manager and server manager from ``agent_loop`` itself."""
    if name in ("AgentLoopWorker", "AgentLoopWorkerBase"):
        from verl.experimental.agent_loop import worker

        return getattr(worker, name)
    if name == "AgentLoopManager":
        from verl.experimental.agent_loop.manager import AgentLoopManager

        return AgentLoopManager
    if name == "_InternalAgentLoopOutput":  # the padded, tensor form of an output (imports torch)
        from verl.experimental.agent_loop.postprocess import _InternalAgentLoopOutput

        return _InternalAgentLoopOutput
    if name == "AsyncLLMServerManager":
        from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager

        return AsyncLLMServerManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
