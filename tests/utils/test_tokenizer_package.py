"""verl.utils.tokenizer as a package: the old imports, and normalize_token_ids."""

import numpy as np
import pytest
import torch


def test_old_import_paths_still_work():
    import verl.utils
    from verl.utils.tokenizer import hf_processor, hf_tokenizer, normalize_token_ids, set_pad_token_id
    from verl.utils.tokenizer.tokenizer import hf_tokenizer as inner

    assert hf_tokenizer is inner
    assert callable(hf_processor) and callable(set_pad_token_id) and callable(normalize_token_ids)
    assert callable(verl.utils.hf_processor)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([5, 6], [5, 6]),
        ((5, 6), [5, 6]),
        (torch.tensor([[5, 6]]), [5, 6]),  # a one-row batch, as return_tensors="pt" gives
        ({"input_ids": np.array([[5, 6]]), "attention_mask": [[1, 1]]}, [5, 6]),
        ([np.int32(5), torch.tensor(6)], [5, 6]),  # integer scalars read with .item()
        ([], []),
    ],
)
def test_normalize_token_ids_reads_every_output_form(output, expected):
    from verl.utils.tokenizer import normalize_token_ids

    result = normalize_token_ids(output)
    assert result == expected and all(type(t) is int for t in result)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("hello", "list of ints"),
        ({"attention_mask": [1]}, "without 'input_ids'"),
        ([[1], [2]], "2 rows"),
        ([1, 2.7], "token_ids[1]=2.7"),  # a float would be truncated silently: refused
        ([True, 2], "token_ids[0]=True"),
    ],
)
def test_normalize_token_ids_refuses_what_is_not_one_row_of_ints(output, message):
    from verl.utils.tokenizer import normalize_token_ids

    with pytest.raises(TypeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        normalize_token_ids(output)
