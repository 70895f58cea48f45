"""The demo model's tokenizer: a byte-level BPE trained locally on a seeded, generated corpus.

Nothing is downloaded: the corpus comes from a small template grammar driven by
``random.Random(seed)``, so the same seed always yields the same merges and the same
``tokenizer.json``.
"""

from __future__ import annotations

import random
from typing import Any

UNK_TOKEN = "<unk>"  # noqa: S105 - a token, not a secret
BOS_TOKEN = "<s>"  # noqa: S105 - a token, not a secret
EOS_TOKEN = "</s>"  # noqa: S105 - a token, not a secret
PAD_TOKEN = "<pad>"  # noqa: S105 - a token, not a secret
SPECIAL_TOKENS = (UNK_TOKEN, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0..3 in this order

# "role: content" lines; an assistant turn ends with </s>, which is also the model's eos, so a
# generation stops where a turn would. The prompt ends with the assistant generation prompt.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- set content = message['content'] -%}"
    "{%- else -%}"
    "{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('\n') -%}"
    "{%- endif -%}"
    "{{- message['role'] + ': ' + content -}}"
    "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
    "{{- '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant:' -}}{%- endif -%}"
)


def _phrases(text: str) -> tuple[str, ...]:
    return tuple(text.split("|"))


_SUBJECTS = _phrases(
    "the router|a tenant|the scheduler|our model|the operator|a worker|the queue|"
    "the cache|a request|the gateway|the engineer|a small robot|the train|the switchyard|"
    "the dispatcher|every replica|the canary|the control plane|a client|the batch|"
    "the budget|my assistant"
)
_VERBS = _phrases(
    "sends|routes|counts|measures|sorts|drops|streams|answers|waits for|assembles|"
    "schedules|retries|balances|reads|writes|publishes|checks|prefers|forgets|remembers|"
    "builds|trains|serves|watches|finds"
)
_ADJECTIVES = _phrases(
    "quick|slow|quiet|green|urgent|cheap|expensive|fair|small|large|warm|cold|busy|idle|"
    "healthy|tired|bright|careful|steady|late"
)
_OBJECTS = _phrases(
    "tokens|requests|trains|messages|batches|credits|endpoints|tracks|signals|numbers|"
    "answers|questions|prompts|replicas|stations|cars|letters|stories|songs|maps|latency|"
    "throughput|errors|rivers"
)
_PLACES = _phrases(
    "on the first track|in the morning|before noon|after the storm|at the station|"
    "under the bridge|across the yard|near the river|in the cloud|on time|without a delay|"
    "with great care|for every tenant|during the rollout"
)
_CONNECTIVES = _phrases("and|but|because|so|while|although|then")
_QUESTIONS = _phrases(
    "what is|where is|how many|why does|when will|who sends|can you explain|"
    "could you list|please describe|tell me about"
)
_GREETINGS = ("hello", "hi", "good morning", "thanks", "thank you", "okay", "sure", "yes", "no")


def _clause(rng: random.Random) -> str:
    parts = [rng.choice(_SUBJECTS), rng.choice(_VERBS)]
    if rng.random() < 0.35:
        parts.append(str(rng.randint(0, 9999)))
    if rng.random() < 0.6:
        parts.append(rng.choice(_ADJECTIVES))
    parts.append(rng.choice(_OBJECTS))
    if rng.random() < 0.5:
        parts.append(rng.choice(_PLACES))
    return " ".join(parts)


def _sentence(rng: random.Random) -> str:
    text = _clause(rng)
    if rng.random() < 0.3:
        text = f"{text}, {rng.choice(_CONNECTIVES)} {_clause(rng)}"
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", ";"))


def _question(rng: random.Random) -> str:
    text = f"{rng.choice(_QUESTIONS)} {rng.choice(_ADJECTIVES)} {rng.choice(_OBJECTS)}"
    return text[0].upper() + text[1:] + "?"


def demo_corpus(*, seed: int, sentences: int = 4000) -> list[str]:
    """Generate the training corpus: prose lines plus "user:/assistant:" chat lines."""
    rng = random.Random(seed)  # noqa: S311 - reproducible text, not a secret
    lines: list[str] = []
    for _ in range(sentences):
        kind = rng.random()
        if kind < 0.6:
            lines.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))))
        elif kind < 0.8:
            lines.append(f"user: {rng.choice(_GREETINGS)}, {_question(rng).lower()}")
        else:
            greeting = rng.choice(_GREETINGS)
            lines.append(f"assistant: {greeting[0].upper()}{greeting[1:]}. {_sentence(rng)}")
    return lines


def train_demo_tokenizer(*, seed: int, vocab_size: int) -> Any:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on :func:`demo_corpus`.

    Special tokens take ids 0..3 (see :data:`SPECIAL_TOKENS`); every byte has a token, so no
    text is ever unknown. Encoding prepends ``<s>``.
    """
    from tokenizers import (  # noqa: PLC0415 - heavy import, only when generating
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    minimum = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} (special tokens + 256 bytes)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(demo_corpus(seed=seed), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tokenizer


def wrap_demo_tokenizer(tokenizer: Any, *, max_context: int) -> Any:
    """Wrap a trained ``tokenizers.Tokenizer`` as a transformers tokenizer with the template."""
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - heavy import

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=max_context,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
