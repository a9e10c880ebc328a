"""``dapo serve``: an OpenAI-compatible HTTP endpoint (vLLM) on a checkpoint of a run.

The checkpoint is a folder (path or object-store URI) or a run folder, meaning its final
checkpoint (workflows/policy_source.py). The served model's name is the checkpoint id, stable
for those weights. Engine settings are the rollout engine's: the run's ``rollout`` section when
the checkpoint lies in a run folder (else the defaults), the context from the checkpoint's
config. One line on stdout says the URL and the model name once the server answers as that model
(not merely once something answers on the port), and stdout holds nothing else: the server's own
output (vLLM's logs and warnings) goes to stderr (cli/main.py: RESULT_ON_STDOUT). Ctrl-C stops it
and exits 130 (SIGTERM: 143), as every command does. A port in use, out of range, or a
host that is not an address of this machine is refused at once, before the checkpoint is read
(engines/rollout/serving.py: ``check_address``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from engines.rollout import stage as rollout, serving, vllm_engine
from settings.rollout import RolloutConfig
from storage.checkpoints import CheckpointError
from workflows.exit_codes import BAD_INPUT, FAILED, INTERRUPTED
from workflows.policy_source import PolicySource, resolve_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo serve``."""
    parser.add_argument("checkpoint", help="checkpoint folder (path or URI), or a run folder (its final checkpoint)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=0,
                        help="prompt + response token limit (default: the run's rollout.max_model_len, else the "
                             "checkpoint's max positions)")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="OpenMP threads of a CPU engine (default: the run's rollout.cpu_threads; 0 = all cores)")
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds to wait for the server to answer before giving up (default: %(default)s)")


def engine_settings_for(policy: PolicySource, *, max_model_len: int = 0,
                        cpu_threads: int | None = None) -> vllm_engine.EngineSettings:
    """The rollout engine's settings for this checkpoint: its run's rollout section, else defaults."""
    config = policy.run_config.rollout if policy.run_config else RolloutConfig()
    if cpu_threads is not None:
        config = replace(config, cpu_threads=cpu_threads)
    context = max_model_len or config.max_model_len or rollout.model_max_positions(policy.local_dir)
    return rollout.engine_settings(config, context)


def base_url(host: str, port: int) -> str:
    """Where a client on this machine reaches a server listening on ``host:port``."""
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if serving.is_ipv6(host) else f"http://{host}:{port}"


def run_cli(args: argparse.Namespace) -> int:
    """``dapo serve``: start the server, print where it listens once it serves this model, serve until Ctrl-C."""
    try:
        serving.check_address(args.host, args.port)  # at once, before the weights are read and checked
        policy = resolve_policy(args.checkpoint)
    except (serving.AddressError, CheckpointError, FileNotFoundError) as err:
        print(f"dapo serve: error: {err}", file=sys.stderr)
        return BAD_INPUT
    settings = engine_settings_for(policy, max_model_len=args.max_model_len, cpu_threads=args.cpu_threads)
    on_cpu = not vllm_engine.gpu_count()
    command = serving.server_command(policy.local_dir, settings, model_name=policy.checkpoint_id, host=args.host,
                                     port=args.port, on_cpu=on_cpu)
    url = base_url(args.host, args.port)
    with tempfile.TemporaryDirectory(prefix="dapo-serve-", ignore_cleanup_errors=True) as temp_dir:
        env = serving.server_environment(settings, serving.socket_folder(Path(temp_dir)), on_cpu=on_cpu)
        process = serving.start_server(command, env)
        try:
            serving.wait_until_ready(process, url, model_name=policy.checkpoint_id, timeout_s=args.ready_timeout)
        except serving.ServerError as err:
            serving.stop_server(process)
            print(f"dapo serve: error: {err} (its log is above)", file=sys.stderr)
            return FAILED
        except KeyboardInterrupt:
            serving.stop_server(process)
            return INTERRUPTED
        print(f"dapo serve: {url}/v1 serves model {policy.checkpoint_id!r} (step {policy.step}, {policy.source}); "
              "Ctrl-C to stop", flush=True)
        return serving.serve_until_stopped(process)
