"""b70deploy: health-gated switch and one-command rollback for vLLM Compose stacks.

Module map: each room is one concern; a change goes to the room its concern names. The rooms
are listed from the lowest floor up (FLOORS below): a module imports only from its own room and
the rooms above it in this list.

    errors.py    the exception tree and exit codes (0 ok, 1 failed, 2 bad input)

    state/       the state dir behind one object (statedir): immutable revisions (revisions),
                 the step journal (journal), the deploy lock (lock), the audit log (audit),
                 atomic files and the one file-mode rule (fsio), who and when (stamps), the
                 warm-boot compile caches (caches), room on its disk and writes that must not
                 stop an undo (space), the standby slots' records (slots)
    config/      what the operator writes: stack and node schema (schema), the catalogue with
                 `extends:` (catalogue), parsed stack files kept by content hash (doc_cache),
                 node config loading (node) and its validated settings kept between runs
                 (node_cache), the strict YAML loader (yamlfile), one-line validation errors
                 (validation), safe names (names), the secrets env file (secrets_file), shipped
                 data folders (resources), the files a compose file reads from its folder
                 (compose_folder), the vllm service keys a stack may pass through
                 (compose_keys), hub ids and the Hugging Face cache layout (hub)
    render/      stack + node -> deploy files: templates to compose/.env/vllm.env (files) and
                 their names (filenames), the vLLM argv and entrypoint styles (vllm_args),
                 /dev/dri gids (devices), each platform's GPU access and its read-back from a
                 compose service (gpu), secret masking (masking), a stack's compose: keys
                 merged into the vllm service (passthrough), edits of files inside
                 images (patches), the EAGLE draft copy (draft), the front door's Caddy config
                 (door), whether a stack may sleep as a hot standby (standby); and back: a compose service ->
                 a stack (from_compose), a corrected file -> a patch's edits (patch_derive); and
                 out: a deploy dir's bytes -> Kubernetes manifests (k8s), and those as values
                 for vLLM production-stack's Helm chart (production_stack)
    vllmlog/     what vLLM's log says: boot facts and expectations (bootlog), fatal signatures
                 and stalls (diagnosis)
    ui/          what people are told: live progress (progress), tables and JSON (output), what
                 a notification says, secrets masked (notice), and its fail-open delivery to
                 webhooks and a command (notify)
    deploy/      the switch, pure: the immutable plan and the image it pins (plan), the seam
                 every effect goes through (nodeio), the steps and their compensations (steps),
                 the journaling runner (runner), lock + run + resume + Outcome (driver), the
                 multi-node rollout plan (rollout), Ctrl-C and SIGTERM kept (interrupts), the
                 deploy dir's files written, read and compared with a revision (deploydir), the
                 companions a stop-first drain leaves running (companions)
    docker/      everything that touches the node: the engine's SDK client and containers
                 (engine), a container's state through the docker CLI for fast read-only
                 commands (containers), which engine (endpoint), `docker compose` argv
                 (compose), subprocesses (proc), image probing (image_inspect), the keep tags
                 that protect revisions' images (keep), the hand-run Compose projects on an
                 engine (discover), the health wait (health) and one GET /health (probe), smoke
                 tests (smoke) and their garbage judge (garbage), idle readings (verify), the
                 page-cache read-ahead (pagecache), the front door's config, gate and counters (door),
                 DockerNode (node): the real side of the deploy seam, the render of a deployment
                 with the engine's facts (produce: the one producer of deploy files), the node's
                 GPU platform found and preflighted (platform), and hot standby's slots: vLLM
                 asleep beside the live one, a network alias the door follows (standby), over
                 vLLM's sleep routes by URL: sleep, the wake its level needs, the wait (sleepmode)
    lint/        preflight rules over a LintContext (rules), that context and a finding
                 (findings), reading what docker/produce rendered into it (gather), a KV budget
                 from config.json (kv)
    bench/       benchmarks the way the field report ran them: one request (client), a run
                 (run), a concurrency sweep (sweep), the prompt set (prompts), statistics
                 (stats), spec-decode acceptance (metrics), results files (results), compare and
                 its chart (compare, plot), the capture proxy (capture) and replay (replay),
                 what is measured (deployment), an ETA line (progress), the
                 measurements refused before the first request (guards)
    sim/         the simulated vLLM: HTTP server (server), image builder (image), the `vllm`
                 package files inside it (vllm_tree), the post's model folders (box); the
                 front door's image, built the same way (door_image)
    watch/       `watch` after a switch: looks in, acts out (decide), what it reads from the node
                 (observe), the revisions it rolled back (memory), its systemd unit (unit)
    actions/     one verb, one object: its fields are the options, plan() says what it will do,
                 run() does it (switch, rollback, resume, node_ops, dark, bench_cycle, gc, rollout,
                 inspect, diff, stacks, prepare, stack_from_compose, patch_from_file, init, adopt,
                 imports, watch, export; handmade: the files and preflight of a deployment the tool did not
                 render); the state dir's small changes: pin, unpin, prune, unlock (bookkeeping);
                 the revision store checked and mended (fsck);
                 the one block every mutating command runs in: lock, audit line, notifications
                 (mutating)
    cli/         click commands only: parse flags, build an action, print its result: the root
                 group, COMMANDS and `mutate`, the reporter and exit line of every mutating command
                 (base), the options several commands share (options), shell completion of
                 stacks, revisions and nodes (complete), one module per group of
                 commands (catalogue, lint, deploy, records, revisions, bench, patch, watch, sim,
                 stack, adopt, door, export)
"""

__version__ = "0.1.0"

# The floors, lowest first: a module imports only from its own room or a room on a lower floor
# (tests/test_layout.py reads every import and fails on one that runs back up). deploy/ is the
# pure core: it reaches the node only through the NodeIO seam that docker/ implements.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("state",),
    ("config",),
    ("render", "vllmlog"),
    ("ui",),
    ("deploy",),
    ("docker",),
    ("lint", "bench", "sim"),
    ("watch",),
    ("actions",),
    ("cli",),
)
