"""A small Linformer pretrained with masked-LM on the embedded default corpus.

The corpus is the English documentation shipped inside Python itself (the
standard library's pydoc topics and docstrings), so this runs with no network
and no download. On a 2-core CPU it finishes in under 10 minutes and prints the
validation perplexity next to a unigram model's (see README, "Results"):

  python -m linformer_jax.train --config configs/default.py --workdir runs/default

Any field can be overridden on the command line, e.g.
  --config.model.projected_len=64 --config.total_steps=200
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # 'masked_lm' (pretraining), 'causal_lm', 'classification', or one registered in extensions.
  config.task = 'masked_lm'
  config.seed = 0  # seeds initialisation, shuffling, masking, dropout
  config.total_steps = 1000  # optimizer steps to train for
  config.batch_size = 32  # global batch, in sequences of model.max_len tokens
  config.eval_batch_size = 32  # batch size for evaluation
  config.grad_accum_steps = 1  # micro-batches per step (batch_size must divide evenly)
  config.learning_rate = 2e-3  # peak learning rate after warm-up
  # Linear warm-up from 0 to learning_rate. 200 steps: the learning rate is still 0.75e-3 when
  # the model reaches the unigram loss (step 75-100), which every post-LN run then leaves by
  # step 300; with 100 (1.5e-3 there) some seeds stay on that plateau for 300 steps or more
  # (docs/results_gutenberg.md, "The warm-up decides the plateau").
  config.warmup_steps = 200
  config.end_learning_rate = 0.0  # learning rate reached by linear decay at total_steps
  config.weight_decay = 0.01  # AdamW decoupled weight decay (not on biases/norms)
  config.adam_b1 = 0.9  # AdamW beta1
  config.adam_b2 = 0.98  # AdamW beta2 (RoBERTa)
  config.adam_eps = 1e-6  # AdamW epsilon (RoBERTa)
  config.grad_clip_norm = 1.0  # clip gradients to this global norm (0 disables)
  # Learning rate (and weight decay) of the learned E/F or conv kernels, times the
  # rest's: 0 freezes them (docs/results_parity.md).
  config.projection_learning_rate_scale = 1.0
  # Remove from each update of a learned E/F ('linear') its mean over the k slots, the
  # one vector all slots would move by alike on the unigram plateau (docs/results_gutenberg.md).
  config.projection_remove_common_update = True
  config.log_every = 50  # steps between progress lines and train metrics
  config.eval_every = 200  # steps between evaluations (and at the end)
  config.checkpoint_every = 500  # steps between checkpoints (and at the end)
  config.keep_checkpoints = 2  # newest checkpoints kept in WORKDIR/checkpoints
  # Non-finite steps in a row skipped (state unchanged) before the run stops; 0 = stop at once.
  config.max_skipped_steps = 3
  # A loss above this x the mean of the last 20 is a spike; the newest checkpoint from
  # before it is kept past keep_checkpoints (docs/reliability.md); 0 = only NaN/inf.
  config.spike_factor = 2.0
  config.restore_step = 0  # resume from this kept step, newer ones set aside (0 = the newest)
  # (FIRST, LAST): a jax.profiler trace of those steps in WORKDIR/profile; () = none.
  config.profile_steps = ()
  config.init_from = ''  # another run's workdir to take parameters from ('' = none)
  # Python files (or module names) imported first: your own registered projections,
  # attention kinds, data sources or tasks (docs/extending.md).
  config.extensions = ()
  # The backend the run expects, 'cpu', 'gpu' or 'tpu' ('' = whichever JAX finds);
  # any other stops the run before it writes anything.
  config.platform = ''
  # JAX's persistent compilation cache: a folder (relative = inside the workdir, e.g.
  # 'compilation_cache'; or an absolute path shared by runs); '' = JAX's own setting.
  config.compilation_cache_dir = ''
  config.mesh_shape = (-1, 1)  # devices along ('data', 'model'); -1 = all remaining
  # Logical parameter axes -> mesh axes (None = replicated); see linformer_jax/training/sharding.py.
  config.axis_rules = (('batch', 'data'), ('heads', 'model'), ('mlp', 'model'), ('vocab', 'model'))
  # Split parameters and optimizer state over 'data' too (ZeRO-3 / FSDP): 1/data of them
  # per device, gathered per layer when used; for models that do not fit replicated.
  config.fsdp = False

  config.data = ml_collections.ConfigDict()
  # 'embedded' (Python's own docs), 'text_files', 'tfds', or one registered in extensions.
  config.data.source = 'embedded'
  config.data.path = ''  # text file or folder for source='text_files' (or a source's own path)
  config.data.split_files = {}  # split -> list of file names; train = all the others
  config.data.tfds_name = ''  # TFDS dataset for source='tfds', e.g. 'wiki40b/en'
  config.data.tfds_text_key = 'text'  # feature holding the text in the TFDS dataset
  config.data.tfds_data_dir = ''  # TFDS data_dir ('' = TFDS default)
  config.data.tfds_download = False  # let TFDS download (needs network)
  config.data.train_split = 'train'  # split to train on
  config.data.eval_split = 'validation'  # split evaluated during training
  config.data.tokenizer = 'sentencepiece'  # 'sentencepiece' (trained on train split) or 'byte'
  config.data.vocab_size = 8000  # SentencePiece vocabulary size
  config.data.mask_rate = 0.15  # fraction of tokens masked (80% <mask>, 10% random, 10% kept)
  # The loader keeps up with this model from the main process, so no thread or worker
  # (its measured throughput: docs/data.md).
  config.data.worker_count = 0  # grain worker processes making batches (0 = in the main process)
  config.data.read_threads = 0  # threads making batches ahead in this process (0 = none)
  config.data.prefetch_buffer = 0  # batches those threads keep ready (both > 0 to take effect)
  # Cache for extracted/packed data ('' = $LINFORMER_JAX_CACHE_DIR or ~/.cache/linformer_jax).
  config.data.cache_dir = ''
  # Prepared ArrayRecord shards of each split ('' = a folder of the cache named by
  # the data, tokenizer and max_len); a shared filesystem path for many hosts.
  config.data.prepared_dir = ''
  config.data.prepare_workers = 0  # tokenizing processes when preparing (0 = all cores)
  config.data.sequences_per_shard = 8192  # packed sequences per ArrayRecord shard
  config.data.tokenizer_sample_chars = 100_000_000  # text the tokenizer trains on, at most
  config.data.max_eval_batches = 0  # cap on evaluation batches (0 = the whole split)

  config.model = ml_collections.ConfigDict()
  config.model.attention = 'linformer'  # 'linformer' or 'full' (the Transformer baseline)
  config.model.max_len = 128  # n: sequence length the model is built for
  # k: compressed length of keys/values, an int or one per layer, e.g. (8, 6); typed `object`
  # so that the command line takes either form.
  config.model.projected_len = ml_collections.FieldReference(32, field_type=object)
  config.model.sharing = 'layerwise'  # E/F sharing: 'none', 'headwise', 'kv', 'layerwise'
  config.model.projection = 'linear'  # 'linear', 'random', 'mean', 'max' or 'conv'
  # Initial 'linear' E/F: 'jl' N(0, 1/k) (the paper's), 'local' (window means, as 'mean'),
  # 'xavier' or 'fairseq' uniform; '' = the projection's default ('local' for 'linear').
  config.model.projection_init = ''
  config.model.projection_init_noise = 0.0  # stddev of Gaussian noise on 'local' (0 = none)
  config.model.num_layers = 3  # encoder layers
  config.model.num_heads = 4  # attention heads per layer
  config.model.hidden_dim = 128  # model width
  config.model.mlp_dim = 512  # MLP hidden units
  config.model.vocab_size = config.data.get_ref('vocab_size')  # must equal the tokenizer's
  config.model.dropout_rate = 0.1  # dropout on embeddings and each residual branch (RoBERTa's)
  config.model.attention_dropout_rate = 0.1  # dropout on attention weights P (RoBERTa's)
  config.model.activation_dropout_rate = 0.0  # dropout on the MLP's GELU output (RoBERTa's 0)
  config.model.pre_layer_norm = False  # pre-LN instead of RoBERTa's post-LN
  config.model.dtype = 'float32'  # compute dtype: 'float32' or 'bfloat16'
  config.model.num_segments = 0  # segment embeddings (0: none, as RoBERTa; 2 for sentence pairs)
  config.model.layer_norm_epsilon = 1e-5  # added to the variance in layer norms (BERT: 1e-12)
  config.model.pooling = 'first'  # classifier input: 'first' token, 'mean' or learned 'attention'
  config.model.causal = False  # left-to-right attention (task causal_lm): configs/causal_lm.py
  config.model.block_len = 64  # causal Linformer: b, tokens per block (divides max_len)
  config.model.query_blocks_per_step = 0  # causal Linformer: query blocks at once (0 = all)
  config.model.inference_chunk = 0  # inference: queries and MLP in chunks of this size (0 = all)
  # Bidirectional softmax: 'auto' (cuDNN's fused attention where the step is compiled for a
  # GPU and model.dtype is 16-bit, else einsum), 'einsum', 'xla' or 'cudnn' (a GPU).
  config.model.attention_kernel = 'auto'
  # What a layer keeps for the backward pass: 'none' (all), or recompute the layer and
  # keep 'full' (nothing), 'dots' (matmul outputs), 'dots_no_batch' (dense outputs).
  config.model.remat = 'none'
  # One nn.scan over the layers (parameters stacked on a 'layers' axis; compiled once)
  # instead of a Python loop; needs one projected_len for all layers.
  config.model.scan_layers = False
  return config
