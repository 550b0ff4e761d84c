"""DataProto and the TensorDict helpers where veRL's callers depend on the details: which error a refused input
raises, how worker metrics merge, folding rows, splitting column chunks, and equality with NaNs and cycles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import (
    DataProto,
    InvalidDataError,
    fold_batch_dim,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
)
from verl.utils import tensordict_utils as tu
from verl.utils.tensordict_utils import deep_equal


def rows(n: int, **meta) -> DataProto:
    return DataProto.from_dict(
        {"row": torch.arange(n)}, {"uid": [f"u{i}" for i in range(n)]}, meta_info=dict(meta) or None
    )


# ------------------------------------------------------------------ refused inputs: ValueError and AssertionError
@pytest.mark.parametrize(
    "refuse",
    [
        lambda: rows(6).chunk(5),
        lambda: DataProto.from_dict({"a": torch.ones(4, 3)}, num_batch_dims=2),
        lambda: DataProto.concat([rows(2, config="A"), rows(2, config="B")]),
        lambda: union_numpy_dict({"k": np.arange(3)}, {"k": np.arange(3) + 1}),
        lambda: rows(3).union(DataProto.from_dict({"row": torch.arange(3) + 1})),
    ],
    ids=["uneven_chunk", "two_batch_dims", "meta_conflict", "numpy_union", "tensor_union"],
)
def test_refused_inputs_raise_one_error_that_is_both_value_and_assertion_error(refuse):
    with pytest.raises(InvalidDataError) as info:
        refuse()
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)


def test_error_messages_name_the_key():
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'"):
        DataProto.concat([rows(2, config="A"), rows(2, config="B")])
    with pytest.raises(AssertionError, match="`nd` in tensor_dict1 and tensor_dict2 are not the same object"):
        union_numpy_dict({"nd": np.zeros((2, 3))}, {"nd": np.ones((2, 3))})
    with pytest.raises(AssertionError, match="num_batch_dims=3"):
        DataProto.from_dict({"a": torch.ones(2, 2, 2)}, num_batch_dims=3)


def test_batch_must_have_exactly_one_batch_dim():
    from tensordict import TensorDict

    with pytest.raises(InvalidDataError, match=r"exactly one batch dimension.*\[2, 3\]"):
        DataProto(batch=TensorDict({"a": torch.ones(2, 3)}, batch_size=[2, 3]))


# ------------------------------------------------------------------ metrics and meta_info
def test_concat_merges_metrics_given_as_dicts_lists_of_dicts_or_absent():
    parts = [
        rows(2, metrics=[{"loss": 0.5, "acc": 0.9}], flag=True),
        rows(2, flag=True),  # no metrics at all
        rows(2, metrics={"loss": 0.6, "acc": [0.8, 0.7]}, flag=True),
        rows(2, metrics=[{"loss": 0.1}, {"loss": 0.2}], flag=True),
    ]
    joined = DataProto.concat(parts)
    assert joined.meta_info == {"flag": True, "metrics": {"loss": [0.5, 0.6, 0.1, 0.2], "acc": [0.9, 0.8, 0.7]}}
    assert joined.batch["row"].tolist() == [0, 1] * 4
    with pytest.raises(InvalidDataError, match="dict or a list of dicts"):
        DataProto.concat([rows(1, metrics=[1.0]), rows(1)])


def test_concat_keeps_keys_only_some_parts_have():
    joined = DataProto.concat([rows(1, a="A", shared=1), rows(1, b="B", shared=1)])
    assert joined.meta_info == {"a": "A", "b": "B", "shared": 1}


def test_none_non_tensor_batch_and_meta_info_mean_empty():
    data = DataProto(batch=None, non_tensor_batch=None, meta_info=None)
    assert len(data) == 0 and data.non_tensor_batch == {} and data.meta_info == {}


# ------------------------------------------------------------------ folding rows, column chunks
def test_fold_keeps_one_batch_dim_and_survives_reorder():
    data = rows(6, info="x")
    folded = fold_batch_dim(data.repeat(1), new_batch_size=3)
    assert folded.batch.batch_size == (3,) and folded.batch["row"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    folded.reorder(torch.tensor([2, 0, 1]))
    back = unfold_batch_dim(folded, batch_dims=2)
    assert back.batch["row"].tolist() == [4, 5, 0, 1, 2, 3]
    assert back.non_tensor_batch["uid"].tolist() == ["u4", "u5", "u0", "u1", "u2", "u3"]
    assert back.meta_info == {"info": "x"}


def test_unfold_column_chunks_splits_non_tensor_rows_into_a_table():
    data = DataProto.from_dict(
        {"seq": torch.arange(12).reshape(3, 4), "id": torch.tensor([7, 8, 9])},
        {"labels": [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]], "uid": ["a", "b", "c"]},
        meta_info={"name": "abc"},
    )
    out = data.unfold_column_chunks(2, split_keys=["seq", "labels"])
    assert out.batch["seq"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert out.batch["id"].tolist() == [7, 7, 8, 8, 9, 9]
    assert out.non_tensor_batch["labels"].shape == (6, 1)
    assert (out.non_tensor_batch["labels"] == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]).all()
    assert out.non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b", "c", "c"]
    assert out.meta_info == {"name": "abc"}


def test_unfold_column_chunks_refuses_ragged_or_unknown_keys():
    ragged = DataProto.from_dict({"id": torch.arange(2)}, {"labels": [["a", "b"], ["c"]]})
    with pytest.raises(InvalidDataError, match="same length per row"):
        ragged.unfold_column_chunks(2, split_keys=["labels"])
    with pytest.raises(InvalidDataError, match="dim 1 that splits into 3"):
        DataProto.from_dict({"seq": torch.ones(2, 4)}).unfold_column_chunks(3, split_keys=["seq"])
    with pytest.raises(KeyError, match="'nope'"):
        DataProto.from_dict({"seq": torch.ones(2, 4)}).unfold_column_chunks(2, split_keys=["nope"])


# ------------------------------------------------------------------ equality
def test_deep_equal_treats_nans_in_place_as_equal_and_handles_cycles():
    assert deep_equal(np.array([1.0, np.nan, 3.0]), np.array([1.0, np.nan, 3.0]))
    assert not deep_equal(np.array([1.0, np.nan, 3.0]), np.array([np.nan, 1.0, 3.0]))
    assert deep_equal(np.array([float("nan"), "nan"], dtype=object), np.array([float("nan"), "nan"], dtype=object))
    assert deep_equal(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert not deep_equal(torch.tensor([0.0, float("nan")]), torch.tensor([float("nan"), 0.0]))
    loop_a, loop_b = np.array([None], dtype=object), np.array([None], dtype=object)
    loop_a[0], loop_b[0] = loop_a, loop_b
    assert deep_equal(loop_a, loop_b)
    assert not deep_equal(loop_a, np.array([None], dtype=object))
    nested = np.array([[np.array([1, 2]), "t"], [np.array([3.0]), None]], dtype=object)
    assert deep_equal(nested, nested.copy())
    changed = nested.copy()
    changed[1, 1] = "other"
    assert not deep_equal(nested, changed)


def test_union_tensor_dict_accepts_equal_copies_and_refuses_differing_values():
    obs = torch.randn(5, 2)
    left = tu.get_tensordict({"obs": obs, "src": ["a"] * 5})
    union_tensor_dict(left, tu.get_tensordict({"obs": obs.clone(), "rew": torch.ones(5), "src": ["a"] * 5}))
    assert set(left.keys()) == {"obs", "src", "rew"}
    with pytest.raises(InvalidDataError, match="'rew'"):
        union_tensor_dict(left, tu.get_tensordict({"rew": torch.zeros(5)}))


# ------------------------------------------------------------------ concat_tensordict shared values
def test_concat_tensordict_keeps_equal_shared_values_and_refuses_differing_ones():
    nested = [
        torch.nested.as_nested_tensor([torch.arange(n) for n in pair], layout=torch.jagged) for pair in ((2, 3), (4, 1))
    ]
    parts = [tu.get_tensordict({"ids": nested[i], "lab": [f"{i}a", f"{i}b"]}, {"temp": 1.0}) for i in range(2)]
    out = tu.concat_tensordict(parts)
    assert [r.tolist() for r in out["ids"].unbind(0)] == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0]]
    assert tu.get(out, "lab") == ["0a", "0b", "1a", "1b"] and tu.get(out, "temp") == 1.0
    differing = [tu.get_tensordict({"lab": ["a"]}, {"temp": t}) for t in (1.0, 2.0)]
    with pytest.raises(InvalidDataError, match=r"'temp' holds 1.0 in TensorDict 0 but 2.0 in TensorDict 1"):
        tu.concat_tensordict(differing)
    with pytest.raises(InvalidDataError, match="'temp'"):
        tu.concat_tensordict([tu.get_tensordict({}, {"temp": t}) for t in (1.0, 2.0)])
