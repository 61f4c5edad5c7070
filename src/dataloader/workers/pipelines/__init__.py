"""Pipelines: the registry and the built-in demo tasks."""

from dataloader.workers.pipelines.registry import Pipeline, PipelineRegistry, pipeline, registry

__all__ = ["Pipeline", "PipelineRegistry", "pipeline", "registry"]
