"""DataProto: properties (hypothesis) against plain indexing, plus every error path."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from verl.protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    collate_fn,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)

SETTINGS = settings(max_examples=40, deadline=None)


def make_batch(n: int, seed: int = 0, width: int = 3) -> DataProto:
    """Rows that carry their own index everywhere, so misalignment between keys is visible."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)
    return DataProto.from_dict(
        tensors={
            "row": rows,
            "x": torch.randn(n, width, generator=g),
            "mask": torch.rand(n, width, generator=g) > 0.5,
            "half": torch.randn(n, 2, generator=g).to(torch.bfloat16),
        },
        non_tensors={
            "uid": [f"u{i}" for i in range(n)],
            "extra": [{"i": i, "tags": ["a"] * (i % 3)} for i in range(n)],
            "pair": [[i, -i] for i in range(n)],  # equal-length lists must stay one object per row
        },
        meta_info={"temperature": 1.0},
    )


def assert_rows(data: DataProto, expected_rows: list[int], reference: DataProto) -> None:
    """``data`` holds exactly ``reference``'s rows ``expected_rows`` in that order, tensors and non-tensors alike."""
    assert len(data) == len(expected_rows)
    idx = torch.tensor(expected_rows, dtype=torch.long)
    for key in reference.batch.keys():
        assert torch.equal(data.batch[key], reference.batch[key][idx]), key
    for key, value in reference.non_tensor_batch.items():
        assert data.non_tensor_batch[key].shape == (len(expected_rows),)
        assert list(data.non_tensor_batch[key]) == [value[i] for i in expected_rows], key


sizes = st.integers(min_value=1, max_value=24)


@SETTINGS
@given(n_chunks=st.integers(1, 6), per_chunk=st.integers(1, 5))
def test_chunk_then_concat_is_identity(n_chunks, per_chunk):
    data = make_batch(n_chunks * per_chunk)
    parts = data.chunk(n_chunks)
    assert [len(p) for p in parts] == [per_chunk] * n_chunks
    assert all(p.meta_info == data.meta_info for p in parts)
    assert_rows(DataProto.concat(parts), list(range(len(data))), data)


@SETTINGS
@given(n=sizes, times=st.integers(1, 4), interleave=st.booleans())
def test_repeat_matches_indexing(n, times, interleave):
    data = make_batch(n)
    rows = [i for i in range(n) for _ in range(times)] if interleave else list(range(n)) * times
    assert_rows(data.repeat(times, interleave=interleave), rows, data)


@SETTINGS
@given(n=sizes, data=st.data())
def test_index_forms_agree(n, data):
    batch = make_batch(n)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=3 * n))
    expected = [i % n for i in idx]
    assert_rows(batch[idx], expected, batch)
    assert_rows(batch[np.array(idx, dtype=np.int64)], expected, batch)
    assert_rows(batch[torch.tensor(idx, dtype=torch.long)], expected, batch)
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    assert_rows(batch[torch.tensor(mask)], [i for i in range(n) if mask[i]], batch)
    assert_rows(batch.select_idxs(np.array(mask)), [i for i in range(n) if mask[i]], batch)
    start, stop = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    assert_rows(batch[start:stop], list(range(start, stop)), batch)
    assert_rows(batch.slice(0, n, 2), list(range(0, n, 2)), batch)


@SETTINGS
@given(n=sizes, divisor=st.integers(1, 9))
def test_pad_unpad_roundtrip(n, divisor):
    data = make_batch(n)
    padded, pad = pad_dataproto_to_divisor(data, divisor)
    assert len(padded) % divisor == 0 and 0 <= pad < divisor
    # padding repeats rows from the head, cycling when more than n are needed
    assert_rows(padded, list(range(n)) + [i % n for i in range(pad)], data)
    assert_rows(unpad_dataproto(padded, pad), list(range(n)), data)


@SETTINGS
@given(n=sizes)
def test_pickle_roundtrip_keeps_everything(n):
    data = make_batch(n)
    data.meta_info["metrics"] = {"loss": [0.5]}
    restored = pickle.loads(pickle.dumps(data))
    assert_rows(restored, list(range(n)), data)
    assert restored.meta_info == data.meta_info
    for key in data.batch.keys():
        assert restored.batch[key].dtype == data.batch[key].dtype
    restored.batch["x"] += 1  # tensors from the packed buffer are writable
    assert not torch.equal(restored.batch["x"], data.batch["x"])


def test_pickle_of_views_and_empty_tensors():
    base = torch.arange(20.0).reshape(4, 5)
    data = DataProto.from_dict(
        {"view": base[:, ::2], "empty": torch.zeros(4, 0), "flag": torch.ones(4, dtype=torch.bool)}
    )
    restored = pickle.loads(pickle.dumps(data))
    assert torch.equal(restored.batch["view"], base[:, ::2])
    assert restored.batch["empty"].shape == (4, 0)
    assert restored.batch["flag"].dtype == torch.bool and bool(restored.batch["flag"].all())


@SETTINGS
@given(n=sizes)
def test_union_of_disjoint_and_equal_keys(n):
    data = make_batch(n)
    other = DataProto.from_dict(
        {"row": torch.arange(n), "y": torch.ones(n)},
        {"uid": [f"u{i}" for i in range(n)], "new": list(range(n))},
        meta_info={"temperature": 1.0, "step": 3},
    )
    data.meta_info["metrics"] = {"a": [1.0]}
    other.meta_info["metrics"] = {"a": 2.0, "b": [3.0]}
    data.union(other)
    assert data.meta_info.pop("metrics") == {"a": [1.0, 2.0], "b": [3.0]}  # merged, not a conflict
    assert torch.equal(data.batch["y"], torch.ones(n))
    assert list(data.non_tensor_batch["new"]) == list(range(n))
    assert data.meta_info == {"temperature": 1.0, "step": 3}


def test_union_conflicts_are_errors():
    data = make_batch(4)
    with pytest.raises(ValueError, match="'row'"):
        data.union(DataProto.from_dict({"row": torch.arange(4) + 1}))
    with pytest.raises(ValueError, match="'uid'"):
        make_batch(4).union(DataProto.from_dict(non_tensors={"uid": ["z"] * 4}))
    with pytest.raises(ValueError, match="'temperature'"):
        make_batch(4).union(DataProto.from_dict({"y": torch.ones(4)}, meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="4 and 3 rows"):
        make_batch(4).union(make_batch(3))
    with pytest.raises(ValueError, match="batch sizes"):
        union_tensor_dict(TensorDict({"a": torch.ones(2)}, [2]), TensorDict({"b": torch.ones(3)}, [3]))
    with pytest.raises(ValueError, match="'k'"):
        union_numpy_dict({"k": np.array([1, 2], dtype=object)}, {"k": np.array([1, 3], dtype=object)})


def test_misaligned_lengths_are_errors():
    with pytest.raises(ValueError, match="leading 1 batch dim"):
        DataProto.from_dict({"a": torch.ones(3), "b": torch.ones(4)})
    with pytest.raises(ValueError, match=r"'uid': 2.*batch size 3"):
        DataProto.from_dict({"a": torch.ones(3)}, {"uid": ["a", "b"]})
    with pytest.raises(TypeError, match="numpy array"):
        DataProto(batch=TensorDict({"a": torch.ones(2)}, [2]), non_tensor_batch={"uid": ["a", "b"]})
    with pytest.raises(ValueError, match="at least one"):
        DataProto.from_dict({})


def test_uneven_chunk_needs_auto_padding():
    with pytest.raises(ValueError, match="5 rows into 2 equal parts"):
        make_batch(5).chunk(2)
    padded = DataProto.from_dict({"a": torch.arange(5)}, {"u": list("abcde")}, auto_padding=True)
    parts = padded.chunk(2)
    assert [len(p) for p in parts] == [3, 2]  # torch.chunk sizes, same split for tensors and non-tensors
    assert list(parts[1].non_tensor_batch["u"]) == ["d", "e"]
    DataProtoConfig.auto_padding = True
    try:
        assert [len(p) for p in make_batch(5).chunk(2)] == [3, 2]
    finally:
        DataProtoConfig.auto_padding = False
    with pytest.raises(TypeError, match="DataProtoConfig.auto_padding must be a bool, got 'yes'"):
        DataProtoConfig.auto_padding = "yes"


def test_padding_appends_first_or_last_row():
    data = make_batch(3)
    data.padding(2)
    assert_rows(data, [0, 1, 2, 2, 2], make_batch(3))
    data = make_batch(3)
    data.padding(1, padding_candidate="first")
    assert_rows(data, [0, 1, 2, 0], make_batch(3))


def test_getitem_int_returns_item_and_bad_index_errors():
    data = make_batch(4)
    item = data[-1]
    assert isinstance(item, DataProtoItem)
    assert int(item.batch["row"]) == 3 and item.non_tensor_batch["uid"] == "u3"
    with pytest.raises(IndexError, match="row 4 out of range"):
        data[4]
    with pytest.raises(IndexError, match="out of range"):
        data[[0, 9]]
    with pytest.raises(ValueError, match="boolean mask has 2 entries"):
        data[torch.tensor([True, False])]
    with pytest.raises(TypeError, match="integers or booleans"):
        data[torch.tensor([0.5])]
    with pytest.raises(TypeError, match="indices must be"):
        data["uid"]


def test_select_pop_rename():
    data = make_batch(4)
    sub = data.select(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(sub.batch.keys()) == ["x"] and list(sub.non_tensor_batch) == ["uid"] and sub.meta_info == {}
    assert sub.batch["x"].data_ptr() == data.batch["x"].data_ptr()  # shared, not copied
    deep = data.select(batch_keys=["x"], deepcopy=True)
    assert deep.batch["x"].data_ptr() != data.batch["x"].data_ptr()
    with pytest.raises(KeyError, match="nope"):
        data.select(batch_keys=["nope"])
    popped = data.pop(batch_keys=["x"], non_tensor_batch_keys=["extra"], meta_info_keys=["temperature"])
    assert "x" not in data.batch.keys() and "extra" not in data.non_tensor_batch and "temperature" not in data.meta_info
    assert popped.batch["x"].shape == (4, 3) and len(popped.non_tensor_batch["extra"]) == 4
    data.rename("row", "index")
    data.rename(["index", "mask"], ["row", "m"])
    assert set(data.batch.keys()) == {"row", "m", "half"}
    with pytest.raises(ValueError, match="as many new keys"):
        data.rename(["row"], ["a", "b"])


def test_concat_merges_metrics_and_checks_meta():
    a, b = make_batch(2), make_batch(3, seed=1)
    a.meta_info["metrics"] = {"loss": 1.0, "lr": [0.1]}
    b.meta_info["metrics"] = {"loss": [2.0, 3.0]}
    out = DataProto.concat([a, b])
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0], "lr": [0.1]}
    assert len(out) == 5 and out.meta_info["temperature"] == 1.0
    b.meta_info["temperature"] = 0.7
    with pytest.raises(ValueError, match="'temperature'"):
        DataProto.concat([a, b])
    with pytest.raises(ValueError, match="different non-tensor keys"):
        DataProto.concat([make_batch(2), DataProto.from_dict({"row": torch.arange(2)})])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_reorder_sample_level_repeat_split():
    data = make_batch(5)
    data.reorder(torch.tensor([4, 3, 2, 1, 0]))
    assert_rows(data, [4, 3, 2, 1, 0], make_batch(5))
    assert_rows(make_batch(3).sample_level_repeat([2, 0, 3]), [0, 0, 2, 2, 2], make_batch(3))
    with pytest.raises(ValueError, match="2 counts for 3 rows"):
        make_batch(3).sample_level_repeat([1, 2])
    parts = make_batch(5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1]


def test_make_iterator_covers_each_row_once_per_epoch():
    data = make_batch(8)
    seen = [
        list(mb.batch["row"].tolist())
        for mb in data.make_iterator(4, epochs=2, seed=3, dataloader_kwargs={"shuffle": True})
    ]
    assert len(seen) == 4
    assert sorted(seen[0] + seen[1]) == list(range(8)) and sorted(seen[2] + seen[3]) == list(range(8))
    again = [
        list(mb.batch["row"].tolist()) for mb in data.make_iterator(4, 2, seed=3, dataloader_kwargs={"shuffle": True})
    ]
    assert again == seen  # seeded
    assert [list(mb.batch["row"].tolist()) for mb in data.make_iterator(4, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="do not divide"):
        data.make_iterator(3, 1)


def test_fold_unfold_and_column_chunks():
    data = make_batch(6)
    folded = fold_batch_dim(data, 2)
    # veRL's layout: the batch keeps one batch dim; each folded row holds 3 original rows
    assert folded.batch.batch_size == (2,) and folded.batch["x"].shape == (2, 3, 3)
    assert folded.non_tensor_batch["uid"].shape == (2, 3)
    assert_rows(unfold_batch_dim(folded), list(range(6)), data)
    with pytest.raises(ValueError, match="do not fold"):
        fold_batch_dim(data, 4)
    cols = DataProto.from_dict({"seq": torch.arange(8).reshape(2, 4), "id": torch.tensor([7, 9])}, {"u": ["a", "b"]})
    unfolded = cols.unfold_column_chunks(2, split_keys=["seq"])
    assert unfolded.batch["seq"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert unfolded.batch["id"].tolist() == [7, 7, 9, 9] and list(unfolded.non_tensor_batch["u"]) == list("aabb")


def test_tensordict_roundtrip_and_collate():
    data = make_batch(3)
    td = data.to_tensordict()
    back = DataProto.from_tensordict(td)
    assert_rows(back, [0, 1, 2], data)
    assert back.meta_info == data.meta_info
    stacked = collate_fn([data[2], data[0]])
    assert_rows(stacked, [2, 0], data)


def test_save_and_load_from_disk(tmp_path):
    data = make_batch(5)
    path = tmp_path / "batch.pkl"
    data.save_to_disk(path)
    assert_rows(DataProto.load_from_disk(path), list(range(5)), data)
    with open(tmp_path / "other.pkl", "wb") as f:
        pickle.dump({"not": "a batch"}, f)
    with pytest.raises(TypeError, match="does not hold a DataProto"):
        DataProto.load_from_disk(tmp_path / "other.pkl")


def test_non_tensor_only_and_from_single_dict():
    only = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    assert len(only) == 3 and only.batch is None
    assert list(only[[2, 0]].non_tensor_batch["uid"]) == ["c", "a"]
    single = DataProto.from_single_dict({"a": torch.ones(2), "u": np.array(["x", "y"], dtype=object)})
    assert "a" in single.batch.keys() and "u" in single.non_tensor_batch
    with pytest.raises(TypeError, match="'bad'"):
        DataProto.from_single_dict({"bad": [1, 2]})
