"""Reference models written as meshfuse programs (forward and backward FusionDefinitions)."""
from .transformer import (BACKWARD_OUTPUTS, FORWARD_OUTPUTS, PARAMETERS, SCHEDULES, TransformerBackward,
                          TransformerConfig, TransformerForward, apply_schedule, define_backward, define_forward,
                          mesh_for, output_shardings, shard_inputs)

__all__ = ["BACKWARD_OUTPUTS", "FORWARD_OUTPUTS", "PARAMETERS", "SCHEDULES", "TransformerBackward",
           "TransformerConfig", "TransformerForward", "apply_schedule", "define_backward", "define_forward",
           "mesh_for", "output_shardings", "shard_inputs"]
