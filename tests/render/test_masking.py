"""Which names hold secrets (render/masking.is_secret): whole words of the name, so a count of
tokens or a flag about tokens is no secret, and a token, key or password is."""

from __future__ import annotations

import pytest

from b70deploy.actions.diff import unified
from b70deploy.render.masking import (
    NONE,
    Secrets,
    is_secret,
    mask,
    mask_bytes,
    mask_env_text,
    modes,
    opaque,
    private_mode,
)

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


def test_one_value_has_one_fingerprint_however_it_is_quoted() -> None:
    """The diff of an adopted `.env` (bare) and a rendered vllm.env (quoted) showed two
    fingerprints for one HF_TOKEN: mask() takes the value as the program reads it."""
    lines = ["HF_TOKEN=hf_same$value", "HF_TOKEN='hf_same$value'", 'HF_TOKEN="hf_same\\$value"',
             "export HF_TOKEN = hf_same$value"]
    shown = {mask_env_text(line).split("=", 1)[1].strip() for line in lines}
    assert shown == {mask("hf_same$value")}


def test_compose_text_masks_secret_keys_and_known_values_and_keeps_references() -> None:
    secrets = Secrets(keys=frozenset({"DATABASE_URL"}), values=frozenset({"s3cr3t-known"}))
    text = ("services:\n  db:\n    environment:\n      POSTGRES_PASSWORD: \"pw'1\"\n"
            "      DATABASE_URL: postgres://app:pw@db/app\n      REF_PASSWORD: ${DB_PASSWORD}\n"
            "      URL_PASSWORD: postgres://app:${DB_PASSWORD}@db\n    command: [\"--api-key=k3y\"]\n"
            "      - API_KEY=item\n    labels:\n      note: \"it says s3cr3t-known\"\n")
    shown = secrets.text(text)
    assert f"POSTGRES_PASSWORD: {mask(chr(112) + 'w' + chr(39) + '1')}" in shown
    assert f"DATABASE_URL: {mask('postgres://app:pw@db/app')}" in shown
    assert "REF_PASSWORD: ${DB_PASSWORD}\n" in shown and "URL_PASSWORD: postgres://app:${DB_PASSWORD}@db" in shown
    assert f"- API_KEY={mask('item')}" in shown and "k3y" not in shown
    assert f"it says {mask('s3cr3t-known')}" in shown
    assert secrets.keys_in(text) == ["POSTGRES_PASSWORD", "DATABASE_URL", "api-key", "API_KEY"]
    assert secrets.text(shown) == shown  # masking twice changes nothing


def test_json_documents_mask_secret_variables_not_settings_about_secrets() -> None:
    doc = {"secrets_env_file": "/etc/b70/secrets.env", "environment": {"HF_TOKEN": "hf_x", "A": "note hf_known1"},
           "secrets": ["A"], "n": 3}
    shown = Secrets(values=frozenset({"hf_known1"})).tree(doc)
    assert shown == {"secrets_env_file": "/etc/b70/secrets.env", "n": 3, "secrets": ["A"],
                     "environment": {"HF_TOKEN": mask("hf_x"), "A": f"note {mask('hf_known1')}"}}


def test_a_compose_file_with_a_secret_inline_is_private() -> None:
    assert private_mode("docker-compose.yml", b"services:\n  db:\n    environment:\n      DB_PASSWORD: pw\n") == 0o600
    assert private_mode("docker-compose.yml", b"services:\n  db:\n    environment:\n      DB_PASSWORD: ${P}\n") == 0o644
    assert private_mode("vllm.env", b"X=1\n") == 0o600
    # A bind-mounted file keeps its mode (the container's user reads it), whatever it says.
    assert private_mode("patches/p/marlin_utils.py", b"api_key = os.environ['K']\n") == 0o644


def test_a_file_others_cannot_read_is_stored_private_and_a_script_keeps_its_execute_bit() -> None:
    """The mode of the operator's file it came from (render.masking.private_mode's `source`): a key
    others cannot read stays 0600 whatever its name, a copy is never more readable than its source."""
    key = b"-----BEGIN PRIVATE KEY-----\n"
    assert [private_mode("keys/node.pem", key, m) for m in (0o600, 0o400, 0o640, 0o644, 0o664)] == \
        [0o600, 0o600, 0o600, 0o644, 0o644]
    assert private_mode("keys/node.pem", key) == 0o644  # no source known: by name and content, as before
    assert private_mode("start.sh", b"#!/bin/sh\n", 0o755) == 0o755
    assert private_mode("start.sh", b"#!/bin/sh\n", 0o700) == 0o700
    assert private_mode("vllm.env", b"X=1\n", 0o644) == 0o600  # an env file is private by its name
    assert modes({"keys/node.pem": key, "a.py": b""}, {"keys/node.pem": 0o600}) == {"keys/node.pem": 0o600,
                                                                                   "a.py": 0o644}


def test_a_private_file_but_env_and_compose_files_is_shown_by_its_fingerprint_only() -> None:
    recorded = {"keys/node.pem": 0o600, "vllm.env": 0o600, "compose.yaml": 0o600, "docker-compose.yml": 0o600,
                "start.sh": 0o755}
    assert opaque(recorded, compose_files=("compose.yaml",)) == {"keys/node.pem"}
    assert opaque({"k": 0o644}, {"k": 0o600}) == {"k"}  # private on either side
    old, new = {"keys/node.pem": b"OLD-KEY-abcdef\n"}, {"keys/node.pem": b"NEW-KEY-abcdef\n"}
    text = unified(old, new, old_label="a", new_label="b", hidden={"keys/node.pem"})
    assert "KEY" not in text.replace("PRIVATE KEY", "")
    assert f"-{mask_bytes(old['keys/node.pem'])}\n" in text and f"+{mask_bytes(new['keys/node.pem'])}\n" in text
    assert mask_bytes(b"abc") == mask("abc")  # one fingerprint for a value, in a file or alone


def test_a_basic_auth_label_is_a_secret_in_either_compose_form_and_in_free_text() -> None:
    """Traefik's basic-auth middleware (`users` holds htpasswd hashes) and caddy-docker-proxy's
    basicauth: the label's value is masked wherever the label stands; a router's rule is not."""
    users = "admin:$$apr1$$H6uskkkW$$IgXLP6ewTrSuBkTrqE8wj/"
    for key in ("traefik.http.middlewares.auth.basicauth.users", "traefik.http.middlewares.d.digestauth.users",
                "caddy.basicauth.bob", "caddy.basic_auth.bob"):
        assert is_secret(key), key
    assert not is_secret("traefik.http.routers.api.rule") and not is_secret("traefik.http.middlewares.auth.users")
    listed = (f'    labels:\n      - "traefik.http.middlewares.auth.basicauth.users={users}"\n'
              '      - "traefik.enable=true"\n')
    mapped = f'    labels:\n      traefik.http.middlewares.auth.basicauth.users: "{users}"\n'
    for text in (listed, mapped):
        shown = NONE.text(text)
        assert "apr1" not in shown and mask(users) in shown, shown
        assert private_mode("docker-compose.yml", text.encode()) == 0o600  # a hand-made file's copy: 0600
    assert "traefik.enable=true" in NONE.text(listed)
    line = f"label traefik.http.middlewares.auth.basicauth.users={users} on the container"
    assert "apr1" not in NONE.text(line)
