"""`TransformerXLTokenizer`: this library's tokenizers (bytes, characters,
words, SentencePiece) as a `keras_hub.tokenizers.Tokenizer`."""
import keras
import keras_hub
import numpy as np
import tensorflow as tf

from txl_tf.checks.numpy_checks import as_array
from txl_tf.errors import TxlError
from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.text.base import CONFIG_FILE, Tokenizer, load_tokenizer


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLTokenizer(keras_hub.tokenizers.Tokenizer):
    """Text <-> ids with a `txl_tf.text` tokenizer, for keras-hub's
    preprocessors and `generate`.

    Args:
        tokenizer: a `txl_tf.text.Tokenizer`, or a folder it was saved to
            (`Tokenizer.save`, a model directory's `vocab/`); None until
            `load_assets` (keras-hub's preset loading) sets it.

    No id is special: the paper's corpora have no start or padding token
    (padding is masked, id 0 stands in), and the line end (`<eos>` of
    word vocabularies) is text, so `generate` stops only at the
    `stop_token_ids` it is given.
    """

    backbone_cls = TransformerXLBackbone  # keras-hub's from_preset finds the class by it

    def __init__(self, tokenizer=None, **kwargs):
        super().__init__(**kwargs)
        self.file_assets = [CONFIG_FILE]
        self.start_token_id = self.end_token_id = None
        self.pad_token_id = 0
        self.inner = None
        if tokenizer is not None:
            self.set_tokenizer(tokenizer)
        self.built = True  # no weights (Keras's quantize visits every built layer)

    def set_tokenizer(self, tokenizer):
        """Uses `tokenizer` from now on.

        Args:
            tokenizer: a `txl_tf.text.Tokenizer` or its saved folder.
        """
        if not isinstance(tokenizer, Tokenizer):
            tokenizer = load_tokenizer(tokenizer)
        self.inner = tokenizer

    def _inner(self):
        if self.inner is None:
            raise TxlError("the tokenizer has no vocabulary yet: pass one, or load it with "
                           "TransformerXLTokenizer.from_preset(...)")
        return self.inner

    def tokenize(self, inputs):
        """Strings to ids.

        Args:
            inputs: a string, or strings `[B]`.

        Returns:
            int32 ids: 1-D for a string, ragged `[B, None]` for a batch.
        """
        return self._inner().encode_tf(tf.convert_to_tensor(inputs, tf.string))

    def detokenize(self, inputs):
        """Ids to text (eagerly: decoding runs in Python).

        Args:
            inputs: ids: 1-D, `[B, T]`, ragged or lists.

        Returns:
            A `str` for 1-D ids, else a list of them.
        """
        tokenizer = self._inner()
        if isinstance(inputs, np.ma.MaskedArray):  # masked entries: not read as ids
            inputs = as_array(inputs, "ids", TxlError)
        if isinstance(inputs, tf.RaggedTensor):
            rows = inputs.to_list()
        elif isinstance(inputs, (list, tuple)):
            rows = list(inputs)
        else:
            rows = np.asarray(keras.ops.convert_to_numpy(inputs)).tolist()
        # The ids as given to `decode`, which checks them: a cast to int64 read
        # 1.7 as id 1 and True as id 1.
        if not isinstance(rows, list) or not rows or \
                not isinstance(rows[0], (list, tuple, np.ndarray)):
            return tokenizer.decode(rows)
        return [tokenizer.decode(r) for r in rows]

    def vocabulary_size(self):
        """The vocabulary's size.

        Returns:
            The number of ids.
        """
        return self._inner().vocab_size

    def get_vocabulary(self):
        """The vocabulary.

        Returns:
            The entries in id order (SentencePiece: its pieces; empty for
            bytes).
        """
        inner = self._inner()
        pieces = getattr(inner, "pieces", None)  # SentencePiece's entries() is its model's hash
        return list(pieces if pieces is not None else inner.entries())

    def id_to_token(self, id):
        """The vocabulary entry of an id.

        Args:
            id: an int in `[0, vocabulary_size())`.

        Returns:
            The entry (for bytes: its text).

        Raises:
            TxlError: an id outside the vocabulary, or not an int.
        """
        size = self.vocabulary_size()
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)) or not 0 <= id < size:
            raise TxlError(f"id {id!r} is outside the vocabulary [0, {size})")
        entries = self.get_vocabulary()
        return entries[id] if entries else self._inner().decode(np.array([id], np.int64))

    def token_to_id(self, token):
        """The id of a vocabulary entry.

        Args:
            token: an entry (for bytes: a one-byte text).

        Returns:
            Its int id.

        Raises:
            TxlError: it is not one token of the vocabulary.
        """
        if not isinstance(token, (str, bytes)):  # an array's `in` was numpy's error
            raise TxlError(f"token must be a str (one vocabulary entry), got "
                           f"{type(token).__name__}")
        entries = self.get_vocabulary()
        if token in entries:
            return entries.index(token)
        ids = [] if entries else self._inner().encode(token)
        if len(ids) != 1:
            raise TxlError(f"{token!r} is not one token of the vocabulary")
        return int(ids[0])

    def save_assets(self, dir_path):
        """Saves the tokenizer into a keras-hub preset's assets.

        Args:
            dir_path: the assets folder.
        """
        self._inner().save(dir_path)

    def load_assets(self, dir_path):
        """Loads the tokenizer from a keras-hub preset's assets.

        Args:
            dir_path: the assets folder.
        """
        self.set_tokenizer(dir_path)
