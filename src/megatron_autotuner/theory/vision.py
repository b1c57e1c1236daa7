"""A vision-language model's vision tower (`specs.vision.VisionEncoder`): parameters, FLOPs and the images of a
micro-batch.

The tower sits on the first pipeline stage and sees every image of that stage's micro-batch: an image of T image
tokens (the language model's tokens it turns into) is P = spatial_merge_size^2 x T patches. One image per sequence
(verl's geo3k example: one diagram per prompt), each `Workload.image_tokens_per_sequence` tokens long, part of
the prompt's length.

Parameters: `theory.params.vision_parameters`; FLOPs: `theory.flops.vision_forward_flops`.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload, num_microbatches, packed_batch
from ..specs.vision import VisionEncoder


def patches_per_image(vision: VisionEncoder, image_tokens: float) -> float:
    """P = spatial_merge_size^2 x T patches behind T image tokens."""
    return vision.patches_per_token * image_tokens


def check_images(model: ModelSpec, workload: Workload) -> None:
    """A workload with images needs a vision tower (that they fit in its sequences, `Workload` checks)."""
    tokens = workload.image_tokens_per_sequence
    if tokens and model.vision is None:
        raise ConfigError("image_tokens", f"{model.name} has no vision encoder")


def images_per_microbatch(parallel: ParallelConfig, workload: Workload, largest: bool = False) -> float:
    """Images (sequences) in one micro-batch of the first stage: the mean over a data-parallel rank's micro-batches,
    or with `largest` the most any packed micro-batch holds; b with fixed micro-batches."""
    packed = packed_batch(parallel, workload, padded=False)
    if packed is not None:
        if largest:
            return float(max(len(mb) for mb in packed.micro_batches))
        return workload.global_batch_size / parallel.dp / packed.num_micro_batches
    if workload.max_token_len is not None:
        per_rank = workload.global_batch_size / parallel.dp
        mean = per_rank / num_microbatches(parallel, workload)
        return float(workload.max_token_len // workload.seq_length) if largest else mean
    return float(workload.micro_batch_size)
