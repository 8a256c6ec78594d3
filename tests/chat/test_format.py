import copy
import json

import pytest

from toolrl.chat import FALLBACK_TOOL_PROMPT, ChatFormat

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "d", "parameters": {"type": "object"}}}]


def test_smollm2_template_ignores_tools_so_the_fallback_prompt_is_used(chat):
    assert chat.template_shows_tools is False
    messages = chat.prompt_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS
    )
    assert messages[0]["content"].startswith("Be brief.\n\n")
    assert json.dumps(TOOLS[0]) in messages[0]["content"]
    assert FALLBACK_TOOL_PROMPT.splitlines()[0] in messages[0]["content"]


def test_fallback_adds_a_system_message_when_there_is_none(chat):
    messages = chat.prompt_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert [m["role"] for m in messages] == ["system", "user"]


def test_prompt_ends_with_the_assistant_header(chat, tokenizer):
    ids = chat.prompt_ids([{"role": "user", "content": "hi"}], TOOLS)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_observation_ids_frame_tool_results_in_the_tool_role(chat, tokenizer):
    ids = chat.observation_ids(["42", "Error: x"], model_ended_turn=True)
    assert tokenizer.decode(ids) == (
        "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>tool\nError: x<|im_end|>\n<|im_start|>assistant\n"
    )
    # A turn cut by the token limit gets its end-of-turn token from the observation (masked, not trained).
    cut = chat.observation_ids(["42"], model_ended_turn=False)
    assert cut[0] == tokenizer.eos_token_id and cut[1:] == chat.observation_ids(["42"], model_ended_turn=True)


def test_observation_tokens_equal_the_template_rendering_of_the_whole_conversation(chat, tokenizer):
    """Prompt + generated + observation ids, tokenised piecewise, equal the tokenised full conversation."""
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = chat.prompt_ids(messages, [])
    generated = chat.encode("<tool_call>x</tool_call>") + [tokenizer.eos_token_id]
    observation = chat.observation_ids(["4"], model_ended_turn=True)
    full = messages + [{"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "4"}]
    text = tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=True)
    assert prompt + generated + observation == chat.encode(text)


STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DROPPING_TEMPLATE = STRICT_TEMPLATE.replace(
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}", "{% else %}"
).replace("'<|im_end|>\\n' }}{% endfor %}", "'<|im_end|>\\n' }}{% endif %}{% endfor %}")


@pytest.mark.parametrize("template", [STRICT_TEMPLATE, DROPPING_TEMPLATE], ids=["raises", "drops"])
def test_template_without_tool_role_gets_results_as_wrapped_user_messages(tokenizer, template):
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = template
    chat = ChatFormat(strict)
    assert chat.template_has_tool_role is False
    assert strict.decode(chat.observation_ids(["42"], model_ended_turn=True)) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    example = [{"role": "user", "content": "q"}, {"role": "tool", "content": "7"}]
    assert chat.prompt_messages(example, [])[1] == {"role": "user", "content": "<tool_response>\n7\n</tool_response>"}


def test_smollm2_template_has_a_tool_role(chat):
    assert chat.template_has_tool_role is True


# Templates of the other families, written for these tests in the shape of the originals: Qwen2.5 (ChatML that
# shows the tools in the system turn and sends tool results as a user turn of <tool_response> blocks, several
# results in one turn) and Llama 3.1 (header tokens, results in the ipython role, <|eot_id|> ends a turn).
QWEN_STYLE_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
    "{{ '\\n\\n# Tools\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{% elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% elif m['role'] != 'system' %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_STYLE_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\nYou may call these functions:' }}"
    "{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}{{ '<|eot_id|>' }}{% endif %}"
    "{% for m in messages %}"
    "{% set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def with_template(tokenizer, template, eos=None, special=()):
    tok = copy.deepcopy(tokenizer)
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if eos:
        tok.eos_token = eos
    tok.chat_template = template
    return tok


TEMPLATES = {
    "smollm2-chatml": lambda tok: tok,
    "qwen-style-chatml": lambda tok: with_template(tok, QWEN_STYLE_TEMPLATE),
    "llama3-style": lambda tok: with_template(
        tok,
        LLAMA3_STYLE_TEMPLATE,
        eos="<|eot_id|>",
        special=["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    ),
    "no-tool-role": lambda tok: with_template(tok, STRICT_TEMPLATE),
}


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_two_turns_with_two_results_are_token_exact_across_template_families(tokenizer, family):
    """prompt + generated + observation + generated ids, each tokenised on its own, equal the tokenised
    rendering of the whole conversation: what is trained on is exactly what the model was fed."""
    tok = TEMPLATES[family](tokenizer)
    chat = ChatFormat(tok)
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 2+2 and 3*3?"}]
    tools = TOOLS if chat.template_shows_tools else []
    prompt = chat.prompt_ids(messages, tools)
    first, second = "<tool_call>a</tool_call><tool_call>b</tool_call>", "<answer>4, 9</answer>"
    generated = chat.encode(first) + [chat.end_of_turn_id]
    observation = chat.observation_ids(["4", "9"], model_ended_turn=True)
    final = chat.encode(second) + [chat.end_of_turn_id]
    full = [
        *chat.prompt_messages(messages, tools),
        {"role": "assistant", "content": first},
        *chat.tool_messages(["4", "9"]),
        {"role": "assistant", "content": second},
    ]
    ours = prompt + generated + observation + final
    text = tok.apply_chat_template(full, tools=tools or None, tokenize=False)
    assert tok.decode(ours) == text.rstrip("\n")  # ChatML renders a newline after the last turn
    if family != "llama3-style":
        # Also id for id. Not for the Llama-3 layout on this GPT-2-style tokenizer: its "\n\n" after a header
        # is one token at the end of a prompt and two before text ("\n\n<tool_call>"), so re-tokenising the
        # whole conversation differs from what the model was fed. toolrl trains on what was fed.
        rendered = chat.encode(text)
        assert rendered[: len(ours)] == ours and tok.decode(rendered[len(ours) :]).strip() == ""
    assert chat.template_has_tool_role is (family != "no-tool-role")
    assert chat.template_shows_tools is (family in {"qwen-style-chatml", "llama3-style"})
    if family == "llama3-style":
        assert tok.decode(observation).startswith("<|start_header_id|>ipython<|end_header_id|>\n\n4<|eot_id|>")
    if family == "qwen-style-chatml":
        assert tok.decode(observation) == (
            "\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n9\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n"
        )


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_a_user_turn_after_an_answer_is_token_exact_across_template_families(tokenizer, family):
    """A multi-turn conversation: the model answers, the user speaks again (the next request), the model
    answers again. prompt + answer + user ids + answer equal the template's rendering of the conversation,
    and the user's tokens are framed in the template's own user role."""
    tok = TEMPLATES[family](tokenizer)
    chat = ChatFormat(tok)
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Make a folder docs."}]
    prompt = chat.prompt_ids(messages, [])
    first, request, second = "<answer>done</answer>", "Now move notes.txt into docs.", "<answer>moved</answer>"
    user = chat.user_ids(request, model_ended_turn=True)
    ours = prompt + chat.encode(first) + [chat.end_of_turn_id] + user + chat.encode(second) + [chat.end_of_turn_id]
    full = [
        *chat.prompt_messages(messages, []),
        {"role": "assistant", "content": first},
        {"role": "user", "content": request},
        {"role": "assistant", "content": second},
    ]
    text = tok.apply_chat_template(full, tokenize=False)
    assert tok.decode(ours) == text.rstrip("\n")
    if family != "llama3-style":  # see the test above: that layout re-tokenises "\n\n" differently
        rendered = chat.encode(text)
        assert rendered[: len(ours)] == ours
    cut = chat.user_ids(request, model_ended_turn=False)
    assert cut[0] == chat.end_of_turn_id and cut[1:] == user
    header = {
        "smollm2-chatml": "\n<|im_start|>user\n",
        "qwen-style-chatml": "\n<|im_start|>user\n",
        "llama3-style": "<|start_header_id|>user<|end_header_id|>\n\n",
        "no-tool-role": None,
    }[family]
    if header:
        assert tok.decode(user).startswith(header + request)
