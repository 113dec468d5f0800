"""The engines batchclient starts run the dtype chosen by the hardware
(``batchclient._engine_defaults``): the session's inline engine and its vLLM server."""

from __future__ import annotations

import psutil
import pytest

from batchclient import VLLMBatchInference
from batchclient._engine_defaults import choose_dtype, vllm_on_cpu


@pytest.mark.engine
async def test_the_inline_engine_runs_the_chosen_dtype(inline_client: VLLMBatchInference) -> None:
    import torch

    chosen = choose_dtype(cpu=vllm_on_cpu()).value
    assert inline_client.provider.dtype == chosen
    assert inline_client.provider.identity()["dtype"] == chosen
    engine = inline_client.provider._engine
    assert engine is not None
    running = engine.llm.model_config.dtype
    if chosen == "auto":
        assert running in (torch.bfloat16, torch.float16, torch.float32)
    else:
        assert running == getattr(torch, chosen)


@pytest.mark.server
def test_the_server_is_started_with_the_chosen_dtype(vllm_url: str) -> None:
    port = vllm_url.rsplit(":", 1)[1].split("/")[0]
    servers = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmd and port in cmd:
            servers.append(cmd)
    if not servers:
        pytest.skip("the server is not one this session started")
    (cmd,) = servers
    assert cmd[cmd.index("--dtype") + 1] == choose_dtype(cpu=vllm_on_cpu()).value
