"""The names of the files a render writes into the deploy dir: apart from the renderer, so that
the readers of a deploy dir (deploy/deploydir.py, for `status`) do not import the schema."""

COMPOSE_FILE = "docker-compose.yml"
DOTENV_FILE = ".env"
RUNTIME_ENV_FILE = "vllm.env"  # like DOTENV_FILE, an env file: written 0600 (state/fsio.file_mode)
COMPANIONS_DIR = "companions"  # a stack's companion files (stack companion_files), bound by the companions
COMPANION_SECRETS_SUFFIX = ".secrets.env"  # a companion's secrets env file: NAME.secrets.env, 0600
