"""Architecture name (config.json's `architectures`) -> model class, imported on demand, for every family
of pagedserve/families.py: a family's classes live in models/<module>.py, its decoder classifier in
models/decoder_classifier.py."""

from pagedserve.families import DECODERS, ENCODERS
from pagedserve.models.interface import CausalLM, EncoderModel
from pagedserve.utils.registry import Registry

MODELS: Registry[CausalLM] = Registry("Model architecture", "--model")
# Encoders for the pooling runner: each family's model and its *ForSequenceClassification.
ENCODER_MODELS: Registry[EncoderModel] = Registry("Encoder architecture", "--model")
# Decoders with a classification head, for the pooling runner.
DECODER_CLASSIFIERS: Registry[CausalLM] = Registry("Sequence classifier architecture", "--model")

for _family in DECODERS:
    MODELS.register(_family.architecture, f"pagedserve.models.{_family.module}:{_family.architecture}")
    if _family.classifier:
        DECODER_CLASSIFIERS.register(
            _family.classifier, f"pagedserve.models.decoder_classifier:{_family.classifier}"
        )
for _family in ENCODERS:
    for _architecture in (_family.architecture, _family.classifier):
        if _architecture:
            ENCODER_MODELS.register(_architecture, f"pagedserve.models.{_family.module}:{_architecture}")


def supported_architectures() -> list[str]:
    return MODELS.names()


def get_model_class(architecture: str) -> type[CausalLM]:
    """Raises ConfigError naming the supported architectures."""
    return MODELS.load(architecture)
