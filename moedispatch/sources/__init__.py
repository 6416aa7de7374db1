"""Where a layer comes from: model references, quantization dialects, checkpoint headers.
"""
