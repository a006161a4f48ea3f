"""Logical axis names of every parameter, mapped to mesh axes by config rules.

Parameters are annotated with these names (never with mesh axes), so that the
sharding of a model is a config value (`config.axis_rules`), not code.
"""

VOCAB = 'vocab'  # token vocabulary
EMBED = 'embed'  # hidden (model) dimension
EMBED_OUT = 'embed_out'  # hidden dimension as a dense output
HEADS = 'heads'  # attention heads
PROJECTION_HEADS = 'projection_heads'  # heads of per-head sequence projections E/F
HEAD_DIM = 'head_dim'  # features within a head
HEAD_DIM_IN = 'head_dim_in'  # features within a head, as a kernel input
MLP = 'mlp'  # MLP hidden units
LENGTH = 'length'  # sequence positions (n)
PROJECTED_LENGTH = 'projected_length'  # compressed sequence positions (k)
CONV_WINDOW = 'conv_window'  # positions in one convolution window
CLASSES = 'classes'  # classification labels
SEGMENTS = 'segments'  # input segments (first / second sentence)
LAYERS = 'layers'  # encoder layers stacked by model.scan_layers
