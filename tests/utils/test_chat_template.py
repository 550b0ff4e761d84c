"""initialize_system_prompt / initialize_turn_separator on small hand-made templates (no model download)."""

from jinja2 import Template

from verl.utils.tokenizer.chat_template import initialize_system_prompt, initialize_turn_separator

# ids: <s>=1 </s>=2 "\n"=3 "SYS"=4 and words from 10 up
_SPECIAL = {"<s>": 1, "</s>": 2, "\n": 3, "SYS": 4}


class _WordTokenizer:
    """Splits a rendered template into the special pieces above and space-separated words."""

    def __init__(self, template: str, eos_token_id: int | list[int] = 2):
        self.template = Template(template)
        self.eos_token_id = eos_token_id
        self.vocab: dict[str, int] = {}

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kwargs):
        text = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        ids = []
        pieces = text.replace("<s>", " <s> ").replace("</s>", " </s> ").replace("\n", " \n ").split(" ")
        for word in pieces:
            if word:
                ids.append(_SPECIAL.get(word) or self.vocab.setdefault(word, 10 + len(self.vocab)))
        return {"input_ids": ids}  # the transformers 5 form


_TURN = "{% for m in messages %}<s> {{m['role']}} {{m['content']}}</s>\n{% endfor %}"


def test_separator_is_what_follows_the_close_token():
    # a user turn renders <s> user body </s> \n: the shared tail of two bodies is [</s>, \n]; after eos: [\n]
    assert initialize_turn_separator(_WordTokenizer(_TURN)) == [3]


def test_separator_after_the_last_of_several_eos_ids():
    two_closes = _TURN.replace("</s>", "</s> SYS")  # the turn closes with </s> then SYS, both eos ids
    assert initialize_turn_separator(_WordTokenizer(two_closes, eos_token_id=[2, 4])) == [3]
    # with only </s> as eos, SYS is taken for part of the separator
    assert initialize_turn_separator(_WordTokenizer(two_closes, eos_token_id=2)) == [4, 3]


def test_no_separator_and_unrenderable_template_give_empty():
    assert initialize_turn_separator(_WordTokenizer(_TURN.replace("\n", ""))) == []

    class _Broken(_WordTokenizer):
        def apply_chat_template(self, *args, **kwargs):
            raise ValueError("no template")

    assert initialize_turn_separator(_Broken(_TURN)) == []


def test_system_prompt_is_the_render_before_the_first_turn():
    assert initialize_system_prompt(_WordTokenizer(_TURN)) == []
    with_system = "<s> SYS</s>\n" + _TURN
    # one turn: <s> SYS </s> \n + <s> user </s> \n (the empty body renders nothing); a turn is 4 tokens
    assert initialize_system_prompt(_WordTokenizer(with_system)) == [1, 4, 2, 3]
