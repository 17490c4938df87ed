"""b70deploy: health-gated switch and one-command rollback for vLLM Compose stacks.

Module map: each room is one concern; a change goes to the room its concern names.

    errors.py    the exception tree and exit codes (0 ok, 1 failed, 2 bad input)

    config/      what the operator writes: stack and node schema (schema), the catalogue with
                 `extends:` (catalogue), parsed stack files kept by content hash (doc_cache),
                 node config loading (node), one-line validation errors (validation), safe
                 names (names), the secrets env file (secrets_file), shipped data folders
                 (resources), the files a compose file reads from its folder (compose_folder)
    render/      stack + node -> deploy files: templates to compose/.env/vllm.env (files), the
                 vLLM argv (vllm_args), /dev/dri gids (devices), secret masking (masking),
                 edits of files inside images (patches), the EAGLE draft copy (draft); and
                 back: a compose service -> a stack (from_compose), a corrected file -> a
                 patch's edits (patch_derive)
    docker/      the engine: SDK client and containers (engine), a container's state through
                 the docker CLI for fast read-only commands (containers), which engine (endpoint),
                 `docker compose` argv (compose), subprocesses (proc), image probing
                 (image_inspect), the keep tags that protect revisions' images (keep), the
                 hand-run Compose projects on an engine (discover), and
                 DockerNode (node): the real side of the deploy seam
    state/       the state dir behind one object (statedir): immutable revisions (revisions),
                 the step journal (journal), the deploy lock (lock), the audit log (audit),
                 atomic files and the one file-mode rule (fsio), who and when (stamps)
    deploy/      the switch: the immutable plan (plan), the seam every effect goes through
                 (nodeio), the steps and their compensations (steps), the journaling runner
                 (runner), lock + run + resume + Outcome (driver), the health wait (health) and
                 one GET /health (probe), smoke tests (smoke), idle readings (verify), the
                 multi-node rollout plan (rollout), which deploy-dir files are ours (deploydir)
    vllmlog/     what vLLM's log says: boot facts and expectations (bootlog), fatal signatures
                 and stalls (diagnosis)
    ui/          terminal output: live progress (progress), tables and JSON (output)
    actions/     one verb, one object: its fields are the options, plan() says what it will do,
                 run() does it (switch, rollback, resume, node_ops, dark, bench_cycle, gc, rollout,
                 inspect, diff, stacks, prepare, stack_from_compose, patch_from_file, init, adopt,
                 imports, watch; handmade: the files and preflight of a deployment the tool did not
                 render)
    lint/        preflight rules over a LintContext, and gathering that context
    bench/       prefill/decode/aggregate benchmarks, compare, capture proxy, replay
    sim/         the simulated vLLM: HTTP server, image builder, model folders
    watch/       `watch` after a switch: looks in, acts out (decide), what it reads from the node
                 (observe), the revisions it rolled back (memory), its systemd unit (unit)
    notify/      what a notification says, secrets masked (event), and its fail-open delivery to
                 webhooks and a command (deliver)
    cli/         click commands only: parse flags, build an action, print its result
"""

__version__ = "0.1.0"
