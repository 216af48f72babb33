"""Prompt formats of the published checkpoint families: Huginn's chat prompt is its published chat
template (huginn-0125's tokenizer_config.json) rendered, and its special tokens stay single tokens in
the published tokenizer layout (published_checkpoints.py); the retrofitted Llama's prompt is fixed
plain completion.
"""
from wise.data.examples import Example, Passage
from wise.data.prompts import format_prompt
from wise.data.tokenizer import load_tokenizer

from published_checkpoints import published_huginn

# The chat_template string of huginn-0125's tokenizer_config.json.
HUGINN_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set start_content = "
    "'<|begin_header|>' %}{% set end_content = message['content'] | trim  + '<|end_turn|>' %}{% if "
    "loop.index0 == 0 %}{% set start_content = bos_token + start_content %}{% endif %}{% if "
    "message['role'] == 'Huginn' or message['role'] == 'assistant' %}{% set start_content = "
    "start_content + 'Huginn<|end_header|>\\n\\n' %}{{ start_content }}{% generation %}{{ end_content "
    "}}{% endgeneration %}{% else %}{% set start_content = start_content + message['role'] + "
    "'<|end_header|>\\n\\n' %}{{ start_content }}{{ end_content }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|begin_header|>Huginn<|end_header|>\\n\\n' }}{% else %}{{ "
    "'<|end_text|>' }}{% endif %}")

EXAMPLE = Example("hotpot-1", "hotpotqa", "Which city hosts  the fair? ",
                  (Passage("Fair", "The fair is held in Oslo."), Passage("Oslo", "Oslo is a city.", True)),
                  ("Oslo",))


def test_huginn_chat_prompt_is_the_published_template(tmp_path):
    import jinja2

    # {% generation %} is a transformers extension that only marks assistant text; drop it.
    source = HUGINN_CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    prompt = format_prompt(EXAMPLE, "huginn_chat")
    user = prompt.split("<|begin_header|>user<|end_header|>\n\n")[1].split("<|end_turn|>")[0]
    rendered = jinja2.Environment().from_string(source).render(
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": user}],
        bos_token="<|begin_text|>", add_generation_prompt=True)
    # the BOS token is prepended by id in the pipeline; "Answer:" prefills the open assistant turn
    assert "<|begin_text|>" + prompt == rendered + "Answer:"
    assert "Fair: The fair is held in Oslo." in user and user.endswith("Question: Which city hosts  the fair?")

    folder, _, _ = published_huginn(tmp_path)
    ids = load_tokenizer(folder).encode(prompt, add_special_tokens=False).ids
    assert ids.count(302) == 3 and ids.count(303) == 3 and ids.count(304) == 2  # specials stay single tokens


def test_llama_completion_prompt_is_fixed_plain_completion():
    prompt = format_prompt(EXAMPLE, "llama_completion")
    assert prompt.startswith("Answer the question based on the passages below.\n\nFair: The fair")
    assert prompt.endswith("Question: Which city hosts  the fair? \nAnswer:")
    no_context = format_prompt(EXAMPLE.with_passages(()), "llama_completion")
    assert no_context == "Answer the question.\n\nQuestion: Which city hosts  the fair? \nAnswer:"
