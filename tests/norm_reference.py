"""LayerNorm and RMSNorm by their formulas, for float64 references (autograd through them gives the exact
gradients). torch's own norm kernels are not a reference: past 65536 rows torch 2.11's CUDA F.layer_norm backward
sizes its parameter gradients' scratch by the weight's last dimension (H100: without a weight, a zero bias gradient
at 69437 and 131075 rows of one element, float32 and float64, and an error at three elements; with a normalized
shape of two dims, an error)."""
import torch


def _dims(normalized_shape):
    n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(-n, 0))


def _affine(out, weight, bias):
    out = out if weight is None else out * weight
    return out if bias is None else out + bias


def layer_norm_formula(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm's signature and meaning: (x - mean) / sqrt(biased variance + eps) * weight + bias."""
    centred = input - input.mean(_dims(normalized_shape), keepdim=True)
    variance = centred.square().mean(_dims(normalized_shape), keepdim=True)
    return _affine(centred * (variance + eps).rsqrt(), weight, bias)


def rms_norm_formula(input, normalized_shape, weight=None, eps=None):
    """F.rms_norm's signature and meaning: x / sqrt(mean(x^2) + eps) * weight, eps None the input dtype's epsilon."""
    eps = torch.finfo(input.dtype).eps if eps is None else eps
    return _affine(input * (input.square().mean(_dims(normalized_shape), keepdim=True) + eps).rsqrt(), weight, None)
