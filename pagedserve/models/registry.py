"""Architecture name (config.json's `architectures`) -> model class, imported on demand. Family `t`
lives in models/t.py; config.MODEL_ARCHITECTURES lists the same architectures (a test checks it)."""

from pagedserve.config.pooling import DECODER_CLASSIFIER_ARCHITECTURES
from pagedserve.models.interface import CausalLM, EncoderModel
from pagedserve.utils.registry import Registry

ENCODER_ARCHITECTURE_NAMES = (
    "BertModel",
    "RobertaModel",
    "XLMRobertaModel",
    "BertForSequenceClassification",
    "RobertaForSequenceClassification",
    "XLMRobertaForSequenceClassification",
)

MODELS: Registry[CausalLM] = Registry("Model architecture", "--model")
MODELS.register("LlamaForCausalLM", "pagedserve.models.llama:LlamaForCausalLM")
MODELS.register("MistralForCausalLM", "pagedserve.models.mistral:MistralForCausalLM")
MODELS.register("Qwen2ForCausalLM", "pagedserve.models.qwen2:Qwen2ForCausalLM")
for _module, _architecture in (
    ("qwen3", "Qwen3ForCausalLM"),
    ("gemma2", "Gemma2ForCausalLM"),
    ("gemma3_text", "Gemma3ForCausalLM"),
    ("phi3", "Phi3ForCausalLM"),
    ("falcon", "FalconForCausalLM"),
    ("mixtral", "MixtralForCausalLM"),
    ("qwen2_moe", "Qwen2MoeForCausalLM"),
    ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ("deepseek_v2", "DeepseekV2ForCausalLM"),
    ("deepseek_v2", "DeepseekV3ForCausalLM"),
):
    MODELS.register(_architecture, f"pagedserve.models.{_module}:{_architecture}")


# Encoders for the pooling runner (config.pooling.ENCODER_ARCHITECTURES lists the same; a test checks it).
ENCODER_MODELS: Registry[EncoderModel] = Registry("Encoder architecture", "--model")
for _architecture in ENCODER_ARCHITECTURE_NAMES:
    ENCODER_MODELS.register(_architecture, f"pagedserve.models.bert:{_architecture}")

# Decoders with a classification head, for the pooling runner (the same names as config.pooling's).
DECODER_CLASSIFIERS: Registry[CausalLM] = Registry("Sequence classifier architecture", "--model")
for _architecture in DECODER_CLASSIFIER_ARCHITECTURES:
    DECODER_CLASSIFIERS.register(_architecture, f"pagedserve.models.decoder_classifier:{_architecture}")


def supported_architectures() -> list[str]:
    return MODELS.names()


def get_model_class(architecture: str) -> type[CausalLM]:
    """Raises ConfigError naming the supported architectures."""
    return MODELS.load(architecture)
