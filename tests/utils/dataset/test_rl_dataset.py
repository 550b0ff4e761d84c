"""RLHFDataset over real parquet files: items, overlong prompts, malformed rows, config validation, collate_fn."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.utils.dataset import RLHFDataset, collate_fn
from verl.utils.demo import build_demo_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


def row(question: str, index: int | None = 0, **extra) -> dict:
    info = {"split": "train", "index": index, **extra}
    return {
        "data_source": "verl/arithmetic",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": info,
    }


def write(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class TestItems:
    def test_item_keys_and_left_padding(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row("What is 3 + 4?", index=7), row("What is 1 + 1?", index=None)])
        ds = RLHFDataset(path, tokenizer, {"max_prompt_length": 24})
        assert len(ds) == 2
        item = ds[0]
        ids = prompt_ids(tokenizer, "What is 3 + 4?")
        pad = 24 - len(ids)
        assert item["input_ids"].tolist() == [tokenizer.pad_token_id] * pad + ids
        assert item["attention_mask"].tolist() == [0] * pad + [1] * len(ids)
        assert item["position_ids"].tolist() == [0] * pad + list(range(len(ids)))
        assert item["raw_prompt_ids"] == ids
        assert item["raw_prompt"] == [{"role": "user", "content": "What is 3 + 4?"}]
        assert item["data_source"] == "verl/arithmetic" and item["reward_model"]["ground_truth"] == "7"
        assert item["index"] == 7 and ds[1]["index"] == 1  # extra_info.index, else the row's position
        assert item["tools_kwargs"] == {} and item["interaction_kwargs"] == {}
        assert "prompt" not in item and "full_prompts" not in item

    def test_optional_outputs_and_template_kwargs(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row("What is 3 + 4?", tools_kwargs={"calc": {"x": 1}})])
        cfg = {
            "return_raw_chat": False,
            "return_full_prompt": True,
            "apply_chat_template_kwargs": {"add_generation_prompt": False},
        }
        item = RLHFDataset(path, tokenizer, cfg)[0]
        assert "raw_prompt" not in item
        assert item["full_prompts"] == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
        assert item["tools_kwargs"] == {"calc": {"x": 1}}

    def test_several_files_in_order_and_dictconfig(self, tokenizer, tmp_path):
        a = write(tmp_path / "a.parquet", [row("What is 1 + 1?", index=None)])
        b = write(tmp_path / "b.parquet", [row("What is 2 + 2?", index=None), row("What is 3 + 3?", index=None)])
        ds = RLHFDataset([a, b], tokenizer, OmegaConf.create({"max_prompt_length": 32}))
        assert [ds[i]["raw_prompt"][0]["content"][8] for i in range(3)] == ["1", "2", "3"]
        assert [ds[i]["index"] for i in range(3)] == [0, 1, 2]
        assert ds[0]["input_ids"].shape == (32,)

    def test_pads_with_eos_when_there_is_no_pad_token(self, tmp_path):
        tok = build_demo_tokenizer()
        tok.pad_token = None
        ds = RLHFDataset(write(tmp_path / "a.parquet", [row("What is 3 + 4?")]), tok, {"max_prompt_length": 20})
        assert ds[0]["input_ids"][0].item() == tok.eos_token_id

    def test_max_samples(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row(f"What is {i} + 0?", index=i) for i in range(10)])
        first = RLHFDataset(path, tokenizer, {"shuffle": False}, max_samples=3)
        assert [first[i]["index"] for i in range(3)] == [0, 1, 2]
        picks = [
            [d[i]["index"] for i in range(len(d))]
            for d in (RLHFDataset(path, tokenizer, {"seed": s}, max_samples=4) for s in (1, 1, 2))
        ]
        assert picks[0] == picks[1] == sorted(picks[0]) and len(picks[0]) == 4 and picks[0] != picks[2]
        assert (
            len(RLHFDataset(path, tokenizer, {}, max_samples=-1))
            == len(RLHFDataset(path, tokenizer, {}, max_samples=50))
            == 10
        )


class TestOverlong:
    QUESTION = "What is 1 + 1? " * 4  # 41 tokens once templated

    def test_error_names_file_row_and_length(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row("What is 1 + 1?"), row(self.QUESTION)])
        with pytest.raises(ValueError, match=r"a.parquet: row 1: field 'prompt': \d+ tokens") as e:
            RLHFDataset(path, tokenizer, {"max_prompt_length": 20})
        assert "filter_overlong_prompts" in str(e.value)

    def test_filter_drops_them(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row("What is 1 + 1?"), row(self.QUESTION, index=1)])
        ds = RLHFDataset(path, tokenizer, {"max_prompt_length": 20, "filter_overlong_prompts": True})
        assert len(ds) == 1 and ds[0]["index"] == 0

    @pytest.mark.parametrize("mode", ["left", "right", "middle"])
    def test_truncation(self, tokenizer, tmp_path, mode):
        ids = prompt_ids(tokenizer, self.QUESTION)
        expected = {"left": ids[-10:], "right": ids[:10], "middle": ids[:5] + ids[-5:]}[mode]
        ds = RLHFDataset(
            write(tmp_path / "a.parquet", [row(self.QUESTION)]),
            tokenizer,
            {"max_prompt_length": 10, "truncation": mode},
        )
        item = ds[0]
        assert item["input_ids"].tolist() == expected and item["raw_prompt_ids"] == expected
        assert item["attention_mask"].tolist() == [1] * 10

    def test_odd_middle_keeps_more_of_the_end(self, tokenizer, tmp_path):
        ids = prompt_ids(tokenizer, self.QUESTION)
        ds = RLHFDataset(
            write(tmp_path / "a.parquet", [row(self.QUESTION)]),
            tokenizer,
            {"max_prompt_length": 7, "truncation": "middle"},
        )
        assert ds[0]["raw_prompt_ids"] == ids[:3] + ids[-4:]


class TestMalformedRows:
    @pytest.mark.parametrize(
        ("bad", "match"),
        [
            ({"prompt": []}, r"row 1: field 'prompt': expected a non-empty list"),
            ({"prompt": [{"content": "hi"}]}, r"row 1: field 'prompt'\[0\]: expected a message with a string 'role'"),
            ({"prompt": [{"role": "user", "content": None}]}, r"row 1: field 'prompt'\[0\].content: expected a string"),
            ({"data_source": 5}, r"row 1: field 'data_source': expected a string"),
            ({"reward_model": "7"}, r"row 1: field 'reward_model': expected a struct"),
            ({"extra_info": [1]}, r"row 1: field 'extra_info': expected a struct"),
        ],
    )
    def test_each_problem_names_file_row_and_field(self, tokenizer, tmp_path, bad, match):
        good = row("What is 3 + 4?")
        rows = [good, {**good, **bad}]
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # parquet columns have one type: make row 0 bad the same way
            table = pa.Table.from_pylist([rows[1], rows[1]])
        pq.write_table(table, tmp_path / "bad.parquet")
        with pytest.raises(ValueError, match=f"bad.parquet: {match}"):
            RLHFDataset(str(tmp_path / "bad.parquet"), tokenizer, {})

    def test_every_problem_is_reported_at_once(self, tokenizer, tmp_path):
        rows = [{"prompt": "plain text"} for _ in range(13)]
        with pytest.raises(ValueError, match=r"13 malformed data row\(s\)") as e:
            RLHFDataset(write(tmp_path / "a.parquet", rows), tokenizer, {})
        assert str(e.value).count("field 'prompt'") == 10 and "and 3 more" in str(e.value)

    def test_missing_prompt_column(self, tokenizer, tmp_path):
        with pytest.raises(ValueError, match=r"no column 'question' \(data.prompt_key\)"):
            RLHFDataset(write(tmp_path / "a.parquet", [row("hi")]), tokenizer, {"prompt_key": "question"})

    def test_missing_or_unreadable_file(self, tokenizer, tmp_path):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            RLHFDataset(str(tmp_path / "missing.parquet"), tokenizer, {})
        (tmp_path / "x.parquet").write_text("not parquet")
        with pytest.raises(ValueError, match="cannot be read as parquet"):
            RLHFDataset(str(tmp_path / "x.parquet"), tokenizer, {})


class TestConfigAndTokenizer:
    @pytest.mark.parametrize(
        ("cfg", "match"),
        [
            ({"truncation": "both"}, "data.truncation='both'"),
            ({"max_prompt_length": 0}, "data.max_prompt_length=0"),
            ({"max_prompt_length": "64"}, "data.max_prompt_length='64'"),
            ({"max_prompt_length": True}, "data.max_prompt_length=True"),
        ],
    )
    def test_bad_values_name_their_key(self, tokenizer, tmp_path, cfg, match):
        with pytest.raises(ValueError, match=match):
            RLHFDataset(write(tmp_path / "a.parquet", [row("hi")]), tokenizer, cfg)

    def test_no_files_and_processors(self, tokenizer, tmp_path):
        with pytest.raises(ValueError, match="no data files"):
            RLHFDataset([], tokenizer, {})
        with pytest.raises(NotImplementedError, match="multimodal"):
            RLHFDataset(write(tmp_path / "a.parquet", [row("hi")]), tokenizer, {}, processor=object())

    def test_tokenizer_without_chat_template_or_pad(self, tmp_path):
        path = write(tmp_path / "a.parquet", [row("hi")])
        tok = build_demo_tokenizer()
        tok.chat_template = None
        with pytest.raises(ValueError, match="no chat_template"):
            RLHFDataset(path, tok, {})
        tok = build_demo_tokenizer()
        tok.pad_token, tok.eos_token = None, None
        with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
            RLHFDataset(path, tok, {})

    def test_a_failing_chat_template_names_the_row(self, tmp_path):
        tok = build_demo_tokenizer()
        tok.chat_template = (
            "{% for m in messages %}{{ m['content'] }}"
            "{% if m['role'] == 'bad' %}{{ raise_exception('no') }}{% endif %}{% endfor %}"
        )
        path = write(tmp_path / "a.parquet", [row("hi"), {**row("x"), "prompt": [{"role": "bad", "content": "x"}]}])
        with pytest.raises(ValueError, match=r"a.parquet: row 1: field 'prompt': the chat template failed"):
            RLHFDataset(path, tok, {})


class TestCollate:
    def test_tensors_stack_and_the_rest_become_object_arrays(self, tokenizer, tmp_path):
        ds = RLHFDataset(
            write(tmp_path / "a.parquet", [row("What is 3 + 4?"), row("What is 1 + 2?")]),
            tokenizer,
            {"max_prompt_length": 20},
        )
        batch = collate_fn([ds[0], ds[1]])
        assert batch["input_ids"].shape == (2, 20) and batch["input_ids"].dtype == torch.long
        assert batch["raw_prompt_ids"].shape == (2,) and batch["raw_prompt_ids"].dtype == object  # lists stay lists
        assert batch["raw_prompt_ids"][0] == ds[0]["raw_prompt_ids"]
        assert isinstance(batch["reward_model"], np.ndarray) and batch["reward_model"][1]["ground_truth"] == "7"
        proto = DataProto.from_single_dict(batch)
        assert len(proto) == 2 and set(proto.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
        assert proto.non_tensor_batch["data_source"].tolist() == ["verl/arithmetic"] * 2

    def test_equal_length_lists_do_not_become_2d(self):
        batch = collate_fn([{"ids": [1, 2]}, {"ids": [3, 4]}])
        assert batch["ids"].shape == (2,) and batch["ids"][1] == [3, 4]

    def test_errors(self):
        with pytest.raises(ValueError, match="at least one row"):
            collate_fn([])
        with pytest.raises(ValueError, match="row 1 has keys"):
            collate_fn([{"a": 1}, {"b": 2}])


def test_tool_config_path_puts_the_tool_schemas_in_the_prompts(tmp_path):
    from verl.utils.demo_tools import ensure_tool_demo_assets
    from verl.utils.tokenizer import hf_tokenizer

    assets = ensure_tool_demo_assets(tmp_path / "cache")
    tokenizer = hf_tokenizer(assets.model_path)
    path = write(tmp_path / "a.parquet", [row("What is 3 + 4?")])
    config = {"max_prompt_length": 64, "return_full_prompt": True}
    plain = RLHFDataset(path, tokenizer, config)[0]["full_prompts"]
    with_tools = RLHFDataset(path, tokenizer, {**config, "tool_config_path": assets.tool_config_path})[0]
    assert with_tools["full_prompts"] == "<|im_start|>system\nTools: calculator(expression)<|im_end|>" + plain
    assert with_tools["raw_prompt_ids"] == tokenizer(with_tools["full_prompts"], add_special_tokens=False)["input_ids"]


class TestVerlHooks:
    """Subclasses written for veRL's RLHFDataset: ``_read_files_and_tokenize`` sets ``self.dataframe`` (a
    ``datasets.Dataset``), ``maybe_filter_out_long_prompts`` and ``self.dataframe[item]`` are veRL's."""

    def test_a_subclass_reading_its_own_files_as_retool_does(self, tokenizer, tmp_path):
        import datasets

        folder = tmp_path / "Maxwell-Jia" / "AIME_2024"
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([{"Problem": "What is 3 + 4?", "Answer": 7}]), folder / "train.parquet")

        class AimeDataset(RLHFDataset):
            def _read_files_and_tokenize(self):
                frames = []
                for path in self.data_files:
                    frame = datasets.load_dataset(path)["train"]
                    frames.append(frame.map(self.map_fn, remove_columns=frame.column_names))
                self.dataframe = datasets.concatenate_datasets(frames)

            def map_fn(self, row):
                return {
                    "data_source": "aime_2024",
                    "prompt": [{"role": "user", "content": row["Problem"]}],
                    "reward_model": {"ground_truth": str(row["Answer"])},
                    "agent_name": "tool_agent",
                }

        ds = AimeDataset(str(folder), tokenizer, {"max_prompt_length": 24})
        assert len(ds) == 1 and ds[0]["agent_name"] == "tool_agent" and ds[0]["reward_model"]["ground_truth"] == "7"
        assert ds[0]["raw_prompt_ids"] == prompt_ids(tokenizer, "What is 3 + 4?")
        assert ds.dataframe[0]["data_source"] == "aime_2024"

    def test_a_subclass_filtering_after_the_default_hook(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row("What is 3 + 4?", index=0), row("What is 1 + 1?", index=1)])

        class OddOnly(RLHFDataset):
            def _read_files_and_tokenize(self):
                super()._read_files_and_tokenize()
                self.dataframe = self.dataframe.filter(lambda r: r["extra_info"]["index"] % 2 == 1)

            def __getitem__(self, item):
                out = super().__getitem__(item)
                out["question"] = self.dataframe[item]["prompt"][0]["content"]
                return out

        ds = OddOnly(path, tokenizer, {"max_prompt_length": 24})
        assert len(ds) == 1 and ds[0]["question"] == "What is 1 + 1?" and ds[0]["index"] == 1
        # a malformed row a subclass builds is named as files' rows are
        bad = type("Bad", (RLHFDataset,), {"_read_files_and_tokenize": lambda self: setattr(self, "dataframe", [{}])})
        with pytest.raises(ValueError, match=r"self.dataframe: row 0"):
            bad(path, tokenizer, {"max_prompt_length": 24})

    def test_maybe_filter_out_long_prompts(self, tokenizer, tmp_path):
        long_question = "What is " + " + ".join(["1"] * 30) + "?"
        path = write(tmp_path / "a.parquet", [row("What is 3 + 4?"), row(long_question)])
        ds = RLHFDataset(path, tokenizer, {"max_prompt_length": 24, "filter_overlong_prompts": True})
        assert len(ds) == 1  # the long one dropped when built
        frame = [row("What is 3 + 4?"), row(long_question)]
        assert [r["prompt"][0]["content"] for r in ds.maybe_filter_out_long_prompts(frame)] == ["What is 3 + 4?"]
