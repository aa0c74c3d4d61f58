"""Token data for training: the preparation tool that writes Torus token
files (.tok) and Megatron-LM datasets (.bin/.idx) from text.

    python3 -m torus.data.prepare corpus/ --tokenizer tokenizer.json --output train.tok

The C++ runtime reads both formats (torus::run::TokenDataset) and samples
them with torus::run::TokenSampler; docs/data.md describes the formats byte
by byte and the sampler's rules. Only `prepare` lives here: pure Python and
numpy.
"""
