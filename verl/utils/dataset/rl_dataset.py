"""``RLHFDataset``: prompts from parquet files in veRL's schema, chat-templated and tokenized; and ``collate_fn``.

A row (one per prompt)::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],          # data.prompt_key: a non-empty list of messages
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},   # ground_truth required unless style is "model"
     "extra_info": {"split": "train", "index": 0, ...}}

An item is the row's other columns plus ``input_ids``, ``attention_mask``, ``position_ids`` (1-D tensors, left-padded
to ``max_prompt_length``), ``raw_prompt_ids`` (the prompt's token ids, unpadded), ``raw_prompt`` (the messages, when
``return_raw_chat``), ``full_prompts`` (the templated text, when ``return_full_prompt``), ``index``
(``extra_info["index"]``, else the row's position in the files), ``tools_kwargs`` and ``interaction_kwargs`` (from
``extra_info``, default ``{}``).

Config keys (``data.*``, veRL's names; defaults in brackets): ``prompt_key`` [prompt], ``max_prompt_length`` [512],
``filter_overlong_prompts`` [False], ``filter_malformed_rows`` [False; ours, veRL has none], ``truncation`` [error:
error | left | right | middle], ``return_raw_chat`` [True], ``return_full_prompt`` [False],
``apply_chat_template_kwargs`` [{}], ``tool_config_path`` [null: veRL's tool YAML, whose tool schemas the chat
template then shows, as the tool agent loop does], ``function_tool_path`` [null: a file of ``@function_tool`` s, shown
as well], ``shuffle`` [True] and ``seed`` [null → 1] (which rows ``max_samples`` keeps).

Every row is checked and every prompt tokenized when the dataset is built, so a malformed row (a prompt that is not
a non-empty list of ``{"role": str, "content": str}`` messages; a null ``reward_model``, or one without a non-null
``ground_truth`` unless its ``style`` is ``"model"``; a ``data_source`` that is not a string; an ``extra_info`` that
is not a struct) or a prompt too long for ``truncation=error`` fails at start-up, with the file, row (within that
file) and field of each problem. ``filter_malformed_rows`` drops malformed rows instead, logging how many per file.

Loaders: ``create_rl_dataset`` → ``create_rl_sampler`` → ``create_dataloader``. The loader is a torchdata
``StatefulDataLoader`` whose ``state_dict()`` / ``load_state_dict()`` resume exactly where it stopped, in any epoch
(the shuffling sampler's generator state is part of the loader's state). Their keys: ``shuffle`` [True], ``seed``
[null → 1], ``train_max_samples`` / ``val_max_samples`` [-1: all], ``custom_cls.{path, name}`` [none:
RLHFDataset], ``sampler.{class_path, class_name}`` [none: random or sequential]; the number of loader workers
(``dataloader_num_workers``) is the caller's argument.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from verl.utils.reward_score.custom import load_object_from_file
from verl.utils.tensordict_utils import as_object_array

__all__ = [
    "TRUNCATION_MODES",
    "RLHFDataset",
    "collate_fn",
    "create_dataloader",
    "create_rl_dataset",
    "create_rl_sampler",
    "data_config_get",
    "dataloader_seed",
    "dataloader_workers",
]

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")
_MAX_REPORTED = 10  # problems listed in one error message

DATA_DEFAULTS: dict[str, Any] = {
    "prompt_key": "prompt",
    "max_prompt_length": 512,
    "filter_overlong_prompts": False,
    "filter_malformed_rows": False,
    "truncation": "error",
    "return_raw_chat": True,
    "return_full_prompt": False,
    "apply_chat_template_kwargs": {},
    "tool_config_path": None,
    "function_tool_path": None,
    "shuffle": True,
    "seed": None,
}


def data_config_get(config: Any, key: str) -> Any:
    """``config[key]`` from a DictConfig, mapping or None, falling back to veRL's default for ``data.<key>``."""
    value = config.get(key, None) if config is not None else None
    return DATA_DEFAULTS.get(key) if value is None else value


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reward_model_problem(reward_model: Any) -> str | None:
    """What is wrong with a row's ``reward_model``; a rule-scored row (the default style) needs a ``ground_truth``."""
    if reward_model is None:
        return "field 'reward_model': is null; expected {'style': 'rule', 'ground_truth': ...}"
    if not isinstance(reward_model, Mapping):
        return f"field 'reward_model': expected a struct (dict) with a 'ground_truth', got {_short(reward_model)}"
    if reward_model.get("style") == "model":  # scored by a reward model: no reference answer needed
        return None
    if "ground_truth" not in reward_model:
        return "field 'reward_model.ground_truth': missing (rule-scored rows need a reference answer)"
    if reward_model["ground_truth"] is None:
        return "field 'reward_model.ground_truth': is null (rule-scored rows need a reference answer)"
    return None


def _row_problems(row: Mapping[str, Any], prompt_key: str) -> list[str]:
    """Everything wrong with a row, each naming its field; empty when the row is well formed."""
    problems = []
    messages = row.get(prompt_key)
    if not isinstance(messages, (list, tuple, np.ndarray)) or len(messages) == 0:
        problems.append(f"field {prompt_key!r}: expected a non-empty list of chat messages, got {_short(messages)}")
    else:
        for j, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                problems.append(
                    f"field {prompt_key!r}[{j}]: expected a message with a string 'role', got {_short(message)}"
                )
                break
            if not isinstance(message.get("content"), str):
                problems.append(
                    f"field {prompt_key!r}[{j}].content: expected a string, got {_short(message.get('content'))}"
                )
                break
    if "data_source" in row and not isinstance(row["data_source"], str):
        problems.append(f"field 'data_source': expected a string, got {_short(row['data_source'])}")
    reward_problem = _reward_model_problem(row.get("reward_model"))
    if reward_problem is not None:
        problems.append(reward_problem)
    if row.get("extra_info") is not None and not isinstance(row["extra_info"], Mapping):
        problems.append(f"field 'extra_info': expected a struct (dict) or null, got {_short(row['extra_info'])}")
    return problems


def _read_parquet(path: str, prompt_key: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist (data.train_files / data.val_files)")
    try:
        table = pq.read_table(path)
    except Exception as e:
        raise ValueError(f"data file {path!r} cannot be read as parquet: {type(e).__name__}: {e}") from e
    if prompt_key not in table.column_names:
        raise ValueError(
            f"data file {path!r} has no column {prompt_key!r} (data.prompt_key); columns: {table.column_names}"
        )
    return table.to_pylist()


def _truncate(ids: list[int], length: int, mode: str) -> list[int]:
    if len(ids) <= length:
        return ids
    if mode == "left":
        return ids[-length:]
    if mode == "right":
        return ids[:length]
    head = length // 2  # middle: keep both ends
    return ids[:head] + ids[len(ids) - (length - head) :]


class RLHFDataset(Dataset):
    """Prompts for RL from parquet files (see the module docstring for the schema, items and config keys)."""

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        config: Any = None,
        processor: Any = None,
        max_samples: int = -1,
    ):
        if processor is not None:
            raise NotImplementedError("RLHFDataset: multimodal data (a processor) is not supported yet")
        files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        if not files:
            raise ValueError("RLHFDataset: no data files given (data.train_files / data.val_files)")
        self.data_files = [os.path.expanduser(os.fspath(f)) for f in files]
        self.original_data_files = list(self.data_files)
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self.max_samples = -1 if max_samples is None else max_samples
        self.prompt_key = data_config_get(config, "prompt_key")
        self.max_prompt_length = data_config_get(config, "max_prompt_length")
        self.filter_overlong_prompts = bool(data_config_get(config, "filter_overlong_prompts"))
        self.filter_malformed_rows = bool(data_config_get(config, "filter_malformed_rows"))
        self.truncation = data_config_get(config, "truncation")
        self.return_raw_chat = bool(data_config_get(config, "return_raw_chat"))
        self.return_full_prompt = bool(data_config_get(config, "return_full_prompt"))
        self.apply_chat_template_kwargs = dict(data_config_get(config, "apply_chat_template_kwargs"))
        self.tool_config_path = data_config_get(config, "tool_config_path")
        self.function_tool_path = data_config_get(config, "function_tool_path")
        tools = self.tool_config_path or self.function_tool_path
        self.tool_schemas = _tool_schemas(self.tool_config_path, self.function_tool_path) if tools else None
        if isinstance(self.max_prompt_length, bool) or not isinstance(self.max_prompt_length, int):
            raise ValueError(f"data.max_prompt_length={self.max_prompt_length!r} must be a positive int")
        if self.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={self.max_prompt_length!r} must be a positive int")
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r} must be one of {list(TRUNCATION_MODES)}")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("RLHFDataset: the tokenizer has neither a pad token nor an EOS token to pad prompts with")

        # veRL's hooks, in veRL's order; a subclass may override either (its _read_files_and_tokenize sets
        # self.dataframe, a datasets.Dataset or a list of rows)
        self._origins: list[tuple[str, int, int]] | None = None
        self._download()
        self._read_files_and_tokenize()
        self._build_items()

    # -- veRL's hooks -----------------------------------------------------------------------------------------------
    def _download(self, use_origin_parquet: bool = False) -> None:
        """Local copies of the data files (``hdfs://`` paths through the fs cache; local paths as they are)."""
        from verl.utils.fs import copy_to_local

        files = self.original_data_files if use_origin_parquet else self.data_files
        self.data_files = [copy_to_local(f, use_shm=bool(_get(self.config, "use_shm", False))) for f in files]

    def _read_files_and_tokenize(self) -> None:
        """Read the files into ``self.dataframe`` (every row checked, ``max_samples`` kept); the prompts are
        templated, tokenized and length-checked after this hook, whatever it set."""
        rows, origins = self._load_rows()
        rows, self._origins = self._select(rows, origins, self.max_samples, self.config)
        self.dataframe = rows

    @property
    def dataframe(self) -> Any:
        """The rows (veRL's ``datasets.Dataset``; built from the rows on first read, so that a run that never
        reads it never imports ``datasets``)."""
        if isinstance(self._dataframe, list):
            import datasets

            self._dataframe = datasets.Dataset.from_list(self._dataframe)
        return self._dataframe

    @dataframe.setter
    def dataframe(self, value: Any) -> None:
        self._dataframe = value

    def maybe_filter_out_long_prompts(self, dataframe: Any = None) -> Any:
        """``dataframe`` (default: ``self.dataframe``) without the prompts longer than ``max_prompt_length``
        tokens once templated, when ``filter_overlong_prompts``; else as it is."""
        dataframe = self.dataframe if dataframe is None else dataframe
        if not self.filter_overlong_prompts:
            return dataframe
        rows = list(dataframe)
        origins = [("dataframe", i, i) for i in range(len(rows))]
        ids = self.tokenizer(self._apply_chat_template(rows, origins), add_special_tokens=False)["input_ids"]
        keep = [i for i, tokens in enumerate(ids) if len(tokens) <= self.max_prompt_length]
        if isinstance(dataframe, list):
            return [rows[i] for i in keep]
        return dataframe.select(keep)

    def _build_items(self) -> None:
        """Template, tokenize and length-check the rows the hooks left in ``self.dataframe``."""
        frame = self._dataframe
        if isinstance(frame, list) and self._origins is not None and len(self._origins) == len(frame):
            rows, origins = frame, self._origins
        else:  # a subclass's rows: checked here as files' rows are
            rows, origins = self._checked([dict(row) for row in frame], "self.dataframe")
        texts = self._apply_chat_template(rows, origins)
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        self.rows, self.texts, self.prompt_ids, self.origins = self._check_lengths(rows, texts, ids, origins)
        self._dataframe = self.rows

    # -- building ---------------------------------------------------------------------------------------------------
    def _load_rows(self) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
        """Every well-formed row of every file, and where it came from: (file, row in the file, row across all files).

        Malformed rows (see :func:`_row_problems`) are an error listing them, or dropped with a warning when
        ``data.filter_malformed_rows``.
        """
        rows: list[dict[str, Any]] = []
        sources: list[tuple[str, int]] = []
        for path in self.data_files:
            file_rows = _read_parquet(path, self.prompt_key)
            rows.extend(file_rows)
            sources.extend((path, row_no) for row_no in range(len(file_rows)))
        return self._checked(rows, sources)

    def _checked(
        self, rows: list[dict[str, Any]], sources: list[tuple[str, int]] | str
    ) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
        """The well-formed ``rows`` and their origins; ``sources``: each row's (file, row in the file), or one
        name for all (rows a subclass built)."""
        if isinstance(sources, str):
            sources = [(sources, i) for i in range(len(rows))]
        kept: list[dict[str, Any]] = []
        origins: list[tuple[str, int, int]] = []
        listed: list[str] = []
        bad_per_file: dict[str, int] = {}
        rows_per_file: dict[str, int] = {}
        for row, (path, row_no) in zip(rows, sources):
            rows_per_file[path] = rows_per_file.get(path, 0) + 1
            problems = _row_problems(row, self.prompt_key)
            if problems:
                bad_per_file[path] = bad_per_file.get(path, 0) + 1
                if len(listed) < _MAX_REPORTED:
                    listed.append(f"{path}: row {row_no}: " + "; ".join(problems))
                continue
            kept.append(row)
            origins.append((path, row_no, len(origins)))
        total_bad = sum(bad_per_file.values())
        if total_bad and not self.filter_malformed_rows:
            per_file = ", ".join(f"{path}: {n}" for path, n in bad_per_file.items())
            more = f"\n... and {total_bad - len(listed)} more" if total_bad > len(listed) else ""
            raise ValueError(
                f"{total_bad} malformed data row(s) ({per_file}):\n" + "\n".join(listed) + more + "\n"
                "fix the data, or set data.filter_malformed_rows=True to drop such rows"
            )
        for path, n in bad_per_file.items():
            logger.warning(
                "%s: dropped %d of %d rows as malformed (data.filter_malformed_rows)", path, n, rows_per_file[path]
            )
        if total_bad and not kept:
            raise ValueError(
                f"data.filter_malformed_rows dropped all {len(rows)} row(s) of {self.data_files}; "
                "first problems:\n" + "\n".join(listed)
            )
        return kept, origins

    def _select(self, rows: list, origins: list, max_samples: int, config: Any) -> tuple[list, list]:
        """Keep ``max_samples`` rows (all when ≤ 0): a seeded random subset when ``shuffle``, else the first ones."""
        if max_samples is None or max_samples <= 0 or max_samples >= len(rows):
            return rows, origins
        if data_config_get(config, "shuffle"):
            seed = data_config_get(config, "seed")
            rng = np.random.default_rng(1 if seed is None else seed)
            keep = sorted(rng.choice(len(rows), size=max_samples, replace=False).tolist())
        else:
            keep = list(range(max_samples))
        return [rows[i] for i in keep], [origins[i] for i in keep]

    def _apply_chat_template(self, rows: list[dict[str, Any]], origins: list[tuple[str, int, int]]) -> list[str]:
        if rows and getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat_template: set actor_rollout_ref.model.custom_chat_template or use a "
                "tokenizer that defines one"
            )
        texts = []
        for row, (path, row_no, _) in zip(rows, origins):
            try:
                messages = list(row[self.prompt_key])
                kwargs = {"add_generation_prompt": True, **self.apply_chat_template_kwargs, "tokenize": False}
                text = self.tokenizer.apply_chat_template(messages, tools=self.tool_schemas, **kwargs)
            except Exception as e:
                raise ValueError(
                    f"{path}: row {row_no}: field {self.prompt_key!r}: the chat template failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
            texts.append(text)
        return texts

    def _check_lengths(self, rows: list, texts: list, ids: list, origins: list) -> tuple[list, list, list, list]:
        """Drop (``filter_overlong_prompts``) or reject (``truncation=error``) prompts over ``max_prompt_length``."""
        limit = self.max_prompt_length
        overlong = [i for i, tokens in enumerate(ids) if len(tokens) > limit]
        if overlong and self.filter_overlong_prompts:
            keep = [i for i in range(len(rows)) if len(ids[i]) <= limit]
            logger.info("filtered %d of %d prompts longer than %d tokens", len(overlong), len(rows), limit)
            return [rows[i] for i in keep], [texts[i] for i in keep], [ids[i] for i in keep], [origins[i] for i in keep]
        if overlong and self.truncation == "error":
            listed = "\n".join(
                f"{origins[i][0]}: row {origins[i][1]}: field {self.prompt_key!r}: {len(ids[i])} tokens"
                for i in overlong[:_MAX_REPORTED]
            )
            raise ValueError(
                f"{len(overlong)} prompt(s) longer than data.max_prompt_length={limit}:\n{listed}\n"
                "set data.filter_overlong_prompts=True, data.truncation=left|right|middle, or a larger "
                "data.max_prompt_length"
            )
        return rows, texts, ids, origins

    # -- items ------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = dict(self.rows[item])
        messages = row.pop(self.prompt_key)
        ids = _truncate(self.prompt_ids[item], self.max_prompt_length, self.truncation)
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        row["input_ids"] = input_ids
        row["attention_mask"] = attention_mask
        row["position_ids"] = torch.clip(torch.cumsum(attention_mask, dim=0) - 1, min=0)
        row["raw_prompt_ids"] = list(ids)
        if self.return_raw_chat:
            row["raw_prompt"] = list(messages)
        if self.return_full_prompt:
            row["full_prompts"] = self.texts[item]
        extra_info = row.get("extra_info") or {}
        index = extra_info.get("index")
        row["index"] = index if index is not None else self.origins[item][2]
        row["tools_kwargs"] = extra_info.get("tools_kwargs") or {}
        row["interaction_kwargs"] = extra_info.get("interaction_kwargs") or {}
        return row


def _tool_schemas(tool_config_path: str | None, function_tool_path: str | None) -> list[dict[str, Any]]:
    """The OpenAI schemas of the tools of veRL's tool YAML and of a file of ``@function_tool`` s (the tool agent
    loop's tools), as the chat template takes them."""
    from verl.tools.tool_registry import load_all_tools

    return [
        tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        for tool in load_all_tools(tool_config_path, function_tool_path)
    ]


def collate_fn(data_list: list[dict[str, Any]]) -> dict[str, torch.Tensor | np.ndarray]:
    """Rows → one dict: tensors stacked along a new first dim, everything else a 1-D numpy object array.

    The result feeds ``DataProto.from_single_dict``. Every row must have the same keys.
    """
    if not data_list:
        raise ValueError("collate_fn needs at least one row")
    keys = list(data_list[0])
    for i, row in enumerate(data_list):
        if set(row) != set(keys):
            raise ValueError(f"collate_fn: row {i} has keys {sorted(row)}, row 0 has {sorted(keys)}")
    out: dict[str, torch.Tensor | np.ndarray] = {}
    for key in keys:
        values = [row[key] for row in data_list]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            out[key] = as_object_array(values)
    return out


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, None) if config is not None else None
    return default if value is None else value


def _load_class(path_or_module: str, name: str, path_key: str, name_key: str) -> type:
    """Class ``name`` from a Python file (``*.py``) or an importable module (config keys ``path_key``, ``name_key``)."""
    if path_or_module.endswith(".py") or os.path.isfile(os.path.expanduser(path_or_module)):
        obj = load_object_from_file(path_or_module, name, path_key, name_key)
    else:
        obj = getattr(importlib.import_module(path_or_module), name, None)
    if not isinstance(obj, type):
        raise TypeError(f"{name_key}={name!r} from {path_or_module!r} is not a class (got {type(obj).__name__})")
    return obj


def dataloader_seed(data_config: Any) -> int:
    """``data.seed``, or 1 when it is null."""
    return int(_get(data_config, "seed", 1))


def create_rl_dataset(
    data_paths: str | os.PathLike | Sequence[str | os.PathLike],
    data_config: Any,
    tokenizer: Any,
    processor: Any = None,
    is_train: bool = True,
    max_samples: int | None = None,
) -> Dataset:
    """The dataset of ``data_paths``: ``data.custom_cls`` when set, else :class:`RLHFDataset`.

    ``max_samples`` defaults to ``data.train_max_samples`` (``is_train``) or ``data.val_max_samples``.
    """
    if max_samples is None:
        max_samples = int(_get(data_config, "train_max_samples" if is_train else "val_max_samples", -1))
    if _get(_get(data_config, "datagen", {}), "path"):
        raise NotImplementedError("data.datagen (dynamically generated datasets) is not supported yet")
    custom = _get(data_config, "custom_cls", {})
    cls: type = RLHFDataset
    if _get(custom, "path"):
        cls = _load_class(custom["path"], _get(custom, "name", ""), "data.custom_cls.path", "data.custom_cls.name")
        if not issubclass(cls, Dataset):
            raise TypeError(f"data.custom_cls: {cls.__qualname__} must subclass torch.utils.data.Dataset")
    dataset = cls(
        data_files=data_paths, tokenizer=tokenizer, processor=processor, config=data_config, max_samples=max_samples
    )
    logger.info("%s dataset: %d prompts from %s", "train" if is_train else "val", len(dataset), data_paths)
    return dataset


def create_rl_sampler(data_config: Any, dataset: Dataset) -> Sampler:
    """``data.sampler.class_path`` when set; else a seeded random sampler (``data.shuffle``) or a sequential one.

    A custom sampler class is built as ``cls(data_source=dataset, data_config=data_config)`` and needs
    ``data.dataloader_num_workers=0`` (it may change its order from training feedback).
    """
    sampler_cfg = _get(data_config, "sampler", {})
    class_path = _get(sampler_cfg, "class_path")
    if class_path:
        if int(_get(data_config, "dataloader_num_workers", 0)) != 0:
            raise ValueError(
                "data.sampler.class_path needs data.dataloader_num_workers=0 (worker processes would prefetch "
                "batches from a stale order)"
            )
        cls = _load_class(
            class_path, _get(sampler_cfg, "class_name", ""), "data.sampler.class_path", "data.sampler.class_name"
        )
        return cls(data_source=dataset, data_config=data_config)
    if _get(data_config, "shuffle", True):
        generator = torch.Generator()
        generator.manual_seed(dataloader_seed(data_config))
        return RandomSampler(dataset, generator=generator)
    return SequentialSampler(dataset)


def dataloader_workers(configured: int) -> int:
    """The loader processes to start for ``data.dataloader_num_workers``: at most a quarter of this machine's cores.

    Each is a copy of the driver process that only tokenizes the next batch ahead of time; on a small machine they
    cost memory and compete with the workers for the cores, and buy nothing (veRL's default, 8, suits a GPU node's
    dozens of cores). A cut is logged."""
    cap = (os.cpu_count() or 1) // 4
    if configured > cap:
        logger.info(
            "data.dataloader_num_workers=%d → %d: at most a quarter of this machine's %s cores",
            configured,
            cap,
            os.cpu_count(),
        )
    return min(int(configured), cap)


def create_dataloader(
    dataset: Dataset,
    batch_size: int,
    sampler: Sampler | None = None,
    collate_fn: Callable[[list[Any]], Any] = collate_fn,
    num_workers: int = 0,
    drop_last: bool = True,
) -> StatefulDataLoader:
    """A resumable loader of ``batch_size`` prompts per batch (``state_dict()`` / ``load_state_dict()``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch size {batch_size!r} must be a positive int (data.train_batch_size)")
    if drop_last and len(dataset) < batch_size:
        raise ValueError(
            f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size} "
            "(data.train_batch_size); every batch would be dropped"
        )
    with warnings.catch_warnings():  # torchdata calls a torch API that torch now deprecates, on every construction
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        return StatefulDataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            drop_last=drop_last,
        )
