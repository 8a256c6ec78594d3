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
