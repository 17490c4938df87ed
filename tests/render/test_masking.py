"""Which names hold secrets (render/masking.is_secret): whole words of the name, so a count of
tokens or a flag about tokens is no secret, and a token, key or password is."""

from __future__ import annotations

import pytest

from b70deploy.render.masking import is_secret, mask_env_text

SECRETS = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TOKEN", "GITHUB_TOKEN", "hf_token", "VLLM_API_KEY", "OPENAI_API_KEY",
           "api-key", "APIKEY", "AWS_SECRET_ACCESS_KEY", "CLIENT_SECRET", "SECRETKEY", "DB_PASSWORD", "PASSWD",
           "AWS_ACCESS_KEY_ID", "SSH_PRIVATE_KEY", "BASIC_AUTH", "GOOGLE_APPLICATION_CREDENTIALS"]
NOT_SECRETS = ["MAX_NUM_BATCHED_TOKENS", "max_num_batched_tokens", "enable_prompt_tokens_details",
               "enable-prompt-tokens-details", "return-tokens-as-token-ids", "B70SIM_KV_TOKENS", "TOKENIZER",
               "tokenizer_mode", "skip_tokenizer_init", "VLLM_LOGGING_LEVEL", "AUTHOR", "KEY_FRAMES",
               "PRIVATE_NETWORK", "max_logprobs", ""]


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_names_that_only_mention_tokens_are_not_secrets(name: str) -> None:
    assert not is_secret(name)


def test_env_text_masks_the_token_and_shows_the_token_count() -> None:
    text = mask_env_text("HF_TOKEN=hf_canary\nMAX_NUM_BATCHED_TOKENS=8192\n")
    assert "hf_canary" not in text and "MAX_NUM_BATCHED_TOKENS=8192\n" in text
