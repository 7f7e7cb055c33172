"""The speech experiment of section 4.3 (Table 3) of Katharopoulos et al. (2020),
arXiv:2006.16236, on a SYNTHETIC stand-in for the Wall Street Journal corpus.

- ``task``: the synthetic phoneme-recognition data;
- ``ctc``: connectionist temporal classification (loss, gradient, decoding, error rate);
- ``lstm``: the bidirectional LSTM baseline with backpropagation through time;
- ``encoder``: the non-causal transformer encoder over frames;
- ``models``: the models behind one ``SpeechConfig``;
- ``train``: the training loop, its log and the Table-3-style table.
"""
