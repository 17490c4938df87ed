"""Export commands: `export k8s`."""

from __future__ import annotations

from pathlib import Path

import click

from ..actions.export import ExportK8s
from ..render.k8s import Options
from ..ui.output import emit_json, note
from . import options
from .base import Ctx, pass_ctx
from .complete import revision_numbers


@click.group(epilog="Example: b70deploy export k8s w4a16 --out k8s/ --namespace llm")
def export() -> None:
    pass  # a group: its summary is in COMMANDS (base.py), its commands below


@export.command("k8s", epilog="Examples: b70deploy export k8s w4a16 | kubectl apply -f -  |  "
                              "b70deploy export k8s --revision 12 --out k8s/ --models-claim weights")
@click.argument("stack", required=False)
@click.option("--revision", type=int, shell_complete=revision_numbers,
              help="Export the stored bytes of revision N instead of rendering STACK.")
@click.option("--out", metavar="DIR", help="Write DIR/<project>-<stack>.yaml (default: print the YAML).")
@click.option("--namespace", metavar="NAME", help="The objects' namespace (default: none, kubectl's own).")
@click.option("--models-claim", metavar="PVC", help="Mount the weights from this PersistentVolumeClaim (default: a "
                                                    "hostPath of the node's models_dir).")
@click.option("--hf-cache-claim", metavar="PVC", help="Mount the Hugging Face cache from this PersistentVolumeClaim "
                                                      "(default: a hostPath of the node's hf_cache).")
@click.option("--intel-driver", type=click.Choice(["xe", "i915"]), default="xe", show_default=True,
              help="xpu: the kernel driver of the cluster's GPU nodes (gpu.intel.com/xe or gpu.intel.com/i915).")
@click.option("--no-docker", is_flag=True, help="Never ask the engine (a stack with patches is then refused).")
@click.option("--helm-values", is_flag=True, help="Write values for vLLM production-stack's Helm chart instead "
                                                  "(<name>-values.yaml): an image whose entrypoint is vllm serve, no "
                                                  "patches, a GPU platform.")
@options.as_json("a summary: objects, argv, the Secret's name and keys, notes")
@pass_ctx
def k8s(ctx: Ctx, stack: str | None, revision: int | None, out: str | None, namespace: str | None,
        models_claim: str | None, hf_cache_claim: str | None, intel_driver: str, no_docker: bool,
        helm_values: bool, as_json: bool) -> None:
    """Kubernetes manifests of STACK (or of a revision's exact bytes): a Deployment running the
    compose render's argv byte for byte, a Service on the API port only, a ConfigMap per patched
    file, the GPU as the device plugin's resource, and a reference to a Secret for the node's
    secrets file (its values are never written: create it with kubectl). See docs/kubernetes.md."""
    opts = Options(namespace=namespace, models_claim=models_claim, hf_cache_claim=hf_cache_claim,
                   intel_driver="i915" if intel_driver == "i915" else "xe")
    done = ExportK8s(ctx.node, stack=stack, revision=revision, out=Path(out) if out else None, options=opts,
                     docker=not no_docker, helm_values=helm_values).run()
    if as_json:
        emit_json(done.to_json())
        return
    for n in [*done.notes, *done.export.notes]:
        note(n)
    e = done.export
    if e.secret_name:
        note(f"the Deployment reads Secret {e.secret_name} (keys {', '.join(e.secret_keys)}): create it with "
             f"`kubectl create secret generic {e.secret_name} --from-env-file=<the node's secrets_env_file>`")
    if done.path is None:
        click.echo(done.yaml.decode(), nl=False)
        return
    objects = "values for vLLM production-stack's chart" if done.values is not None else \
        ", ".join(f"{o['kind']} {o['name']}" for o in e.summary())
    click.echo(f"wrote {done.path} ({objects})")
