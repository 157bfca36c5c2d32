#!/usr/bin/env python
"""Mosaic `streaming` (MDS + StreamingDataset) measured for benchmarks/streaming_data.py, in the
virtualenv benchmarks/streaming_mosaic_venv.sh makes (streaming pins its own dependencies).

Usage:
  MOSAIC_VENV/bin/python benchmarks/streaming_mosaic.py PARQUET_DIR MDS_DIR --batch-size 256 --num-workers 1 \
      --columns inputs,labels [--resume-fraction 0.0,0.5,0.9] [--max-batches N]

1. Converts PARQUET_DIR/*.parquet (sorted) to MDS in MDS_DIR with MDSWriter, unless
   MDS_DIR/index.json exists. Encodings come from the Parquet schema.
2. In a fresh subprocess of itself: one epoch of StreamingDataset(local=MDS_DIR, shuffle=True,
   batch_size=B) through StreamingDataLoader(batch_size=B, num_workers=W) with torch's
   default_collate -> samples/s, time to first batch, peak RSS (self + children).
3. For each resume fraction f, in a fresh subprocess: time from constructing the dataset and
   loading a mid-epoch state (StreamingDataLoader.load_state_dict) to the first batch.

Progress goes to stderr; stdout gets exactly one JSON line at the end.
"""
import argparse
import functools
import gc
import glob
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings

RESULT_TAG = '@@BENCH_MOSAIC_RESULT '
CONVERT_META = '_bench_convert.json'


def log(*a):
    print('[bench_mosaic]', *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Importing streaming
# --------------------------------------------------------------------------------------------
def _install_torchvision_stub():
    """`streaming/__init__` imports streaming.vision, which imports torchvision at top level.

    PyPI's torchvision wheels are built against CUDA torch and fail to import with the CPU torch
    build in this venv, so torchvision is not installed. Only the two names streaming.vision
    imports are provided; streaming.vision itself is unusable (not needed here).
    """
    for name in [m for m in sys.modules if m == 'torchvision' or m.startswith('torchvision.')]:
        del sys.modules[name]
    tv = types.ModuleType('torchvision')
    ds = types.ModuleType('torchvision.datasets')
    tr = types.ModuleType('torchvision.transforms')
    fn = types.ModuleType('torchvision.transforms.functional')

    class VisionDataset:  # pragma: no cover - placeholder
        def __init__(self, *a, **k):
            raise RuntimeError('torchvision stub: streaming.vision is unavailable')

    def to_tensor(*a, **k):  # pragma: no cover - placeholder
        raise RuntimeError('torchvision stub: streaming.vision is unavailable')

    ds.VisionDataset = VisionDataset
    fn.to_tensor = to_tensor
    tv.datasets, tv.transforms, tr.functional = ds, tr, fn
    tv.__version__ = '0.0.0+stub'
    sys.modules.update({'torchvision': tv, 'torchvision.datasets': ds,
                        'torchvision.transforms': tr, 'torchvision.transforms.functional': fn})


def import_streaming():
    # transformers must be imported before any stub so that its find_spec('torchvision') check
    # sees the truth (no torchvision) rather than the stub.
    import transformers.feature_extraction_utils  # noqa: F401
    try:
        import torchvision  # noqa: F401
    except Exception:
        _install_torchvision_stub()
    import streaming
    return streaming


def clean_shm(streaming):
    """Remove leaked streaming shared memory from earlier (crashed) runs.

    NB: this removes *all* streaming shm blocks on the machine, so never run two streaming jobs
    at the same time.
    """
    try:
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        return
    clean_stale_shared_memory()


# --------------------------------------------------------------------------------------------
# Parquet -> MDS
# --------------------------------------------------------------------------------------------
_MDS_SCALARS = {'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64',
                'float16', 'float32', 'float64'}
_NDARRAY_DTYPES = _MDS_SCALARS


def _np_dtype_name(t):
    import numpy as np
    import pyarrow as pa
    if pa.types.is_floating(t) or pa.types.is_integer(t):
        return np.dtype(t.to_pandas_dtype()).name
    return None


def column_plan(field):
    """Return (mds_encoding, kind, extra) for a pyarrow field."""
    import pyarrow as pa
    t = field.type
    if pa.types.is_fixed_size_list(t):
        shape = []
        while pa.types.is_fixed_size_list(t):
            shape.append(t.list_size)
            t = t.value_type
        dt = _np_dtype_name(t)
        if dt not in _NDARRAY_DTYPES:
            raise TypeError(f'column {field.name}: unsupported list value type {t}')
        return f'ndarray:{dt}:{",".join(map(str, shape))}', 'fixed', (dt, tuple(shape))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        dt = _np_dtype_name(t.value_type)
        if dt not in _NDARRAY_DTYPES:
            raise TypeError(f'column {field.name}: unsupported list value type {t.value_type}')
        return f'ndarray:{dt}', 'varlist', (dt, None)
    dt = _np_dtype_name(t)
    if dt in _MDS_SCALARS:
        return dt, 'scalar', (dt, None)
    if pa.types.is_boolean(t):
        return 'uint8', 'bool', ('uint8', None)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return 'str', 'pylist', (None, None)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return 'bytes', 'pylist', (None, None)
    raise TypeError(f'column {field.name}: unsupported type {t}')


def _column_values(arr, kind, extra):
    import numpy as np
    import pyarrow as pa
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError('null values are not supported')
    n = len(arr)
    dt, shape = extra
    if kind == 'fixed':
        v = arr
        for _ in shape:
            v = v.flatten()  # respects slicing offsets
        return v.to_numpy(zero_copy_only=False).astype(dt, copy=False).reshape((n, *shape))
    if kind == 'varlist':
        return [np.asarray(x, dtype=dt) for x in arr.to_pylist()]
    if kind == 'scalar':
        return arr.to_numpy(zero_copy_only=False).astype(dt, copy=False)
    if kind == 'bool':
        return arr.to_numpy(zero_copy_only=False).astype('uint8')
    return arr.to_pylist()


def convert(parquet_dir, mds_dir, columns, read_batch_rows, compression, size_limit):
    """Convert parquet -> MDS. Returns (rows, seconds, encodings)."""
    import pyarrow.parquet as pq
    streaming = import_streaming()
    from streaming import MDSWriter

    files = sorted(glob.glob(os.path.join(parquet_dir, '*.parquet')))
    if not files:
        raise SystemExit(f'no *.parquet files in {parquet_dir}')
    schema = pq.read_schema(files[0])
    names = columns or list(schema.names)
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise SystemExit(f'columns {missing} not in parquet schema {schema.names}')
    plan = {c: column_plan(schema.field(c)) for c in names}
    encodings = {c: p[0] for c, p in plan.items()}
    log(f'converting {len(files)} parquet files -> {mds_dir} with encodings {encodings}')

    if os.path.isdir(mds_dir) and os.listdir(mds_dir):
        raise SystemExit(f'{mds_dir} exists, is not empty and has no index.json; '
                         'remove it or pick another MDS_DIR')
    tmp = f'{mds_dir.rstrip("/")}.tmp-{os.getpid()}'
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    rows = 0
    with MDSWriter(out=tmp, columns=encodings, compression=compression,
                   size_limit=size_limit) as w:
        for f in files:
            pf = pq.ParquetFile(f)
            if pf.schema_arrow.names != schema.names and not set(names) <= set(pf.schema_arrow.names):
                raise SystemExit(f'{f}: schema differs from {files[0]}')
            for rb in pf.iter_batches(batch_size=read_batch_rows, columns=names):
                vals = {c: _column_values(rb.column(c), plan[c][1], plan[c][2]) for c in names}
                for i in range(rb.num_rows):
                    w.write({c: vals[c][i] for c in names})
                rows += rb.num_rows
    secs = time.perf_counter() - t0
    if os.path.isdir(mds_dir):
        os.rmdir(mds_dir)  # empty (checked above)
    os.rename(tmp, mds_dir)
    with open(os.path.join(mds_dir, CONVERT_META), 'w') as fh:
        json.dump({'rows': rows, 'convert_s': secs, 'encodings': encodings,
                   'files': [os.path.basename(f) for f in files],
                   'streaming_version': streaming.__version__}, fh)
    log(f'conversion: {rows} rows in {secs:.2f} s ({rows / secs:.0f} rows/s)')
    return rows, secs, encodings


def mds_rows(mds_dir):
    with open(os.path.join(mds_dir, 'index.json')) as fh:
        idx = json.load(fh)
    return sum(s['samples'] for s in idx['shards'])


# --------------------------------------------------------------------------------------------
# Child processes: loading
# --------------------------------------------------------------------------------------------
def collate(columns, samples):
    from torch.utils.data import default_collate
    if columns:
        samples = [{c: s[c] for c in columns} for s in samples]
    return default_collate(samples)


def batch_len(batch):
    return len(next(iter(batch.values())))


def batch_digest(batch):
    h = hashlib.sha1()
    for k in sorted(batch):
        h.update(batch[k].numpy().tobytes())
    return h.hexdigest()[:16]


def peak_rss_kib():
    gc.collect()
    s = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return s, c


def make_loader(args, columns):
    from streaming import StreamingDataLoader, StreamingDataset
    kw = {}
    if args.num_canonical_nodes is not None:
        kw['num_canonical_nodes'] = args.num_canonical_nodes
    if args.shuffle_algo is not None:
        kw['shuffle_algo'] = args.shuffle_algo
    if args.predownload is not None:
        kw['predownload'] = args.predownload
    ds = StreamingDataset(local=args.mds_dir, shuffle=True, batch_size=args.batch_size,
                          shuffle_seed=args.seed, **kw)
    loader = StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=args.num_workers,
                                 collate_fn=functools.partial(collate, columns))
    return ds, loader


def child_setup():
    warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
    streaming = import_streaming()
    clean_shm(streaming)
    return streaming


def child_epoch(args, columns, fractions):
    child_setup()
    n_rows = mds_rows(args.mds_dir)
    B = args.batch_size
    targets = sorted({min(int(f * n_rows) // B * B, max(n_rows - 1, 0)) for f in fractions})

    t0 = time.perf_counter()
    ds, loader = make_loader(args, columns)
    t_built = time.perf_counter()
    it = iter(loader)
    refs = {}  # sample_in_epoch -> {"state": ..., "digest": ...}
    pending = None
    if 0 in targets:
        pending = 0
    first = next(it)
    t_first = time.perf_counter()
    template = loader.state_dict()
    template['sample_in_epoch'] = 0
    if pending == 0:
        refs[0] = {'state': dict(template), 'digest': batch_digest(first), 'genuine': False}
        pending = None
    samples, batches = batch_len(first), 1
    del first
    todo = [s for s in targets if s > 0]
    while args.max_batches is None or batches < args.max_batches:
        if todo and todo[0] == samples:
            st = loader.state_dict()  # a genuine checkpoint at this point of the epoch
            pending = todo.pop(0)
        try:
            batch = next(it)
        except StopIteration:
            break
        if pending is not None:
            refs[pending] = {'state': st, 'digest': batch_digest(batch), 'genuine': True}
            pending = None
        samples += batch_len(batch)
        batches += 1
        del batch
    t_end = time.perf_counter()
    it.close()  # shuts DataLoader workers down (and reaps them, so RUSAGE_CHILDREN sees them)
    del it
    self_kib, child_kib = peak_rss_kib()
    return {
        'rows': n_rows,
        'samples': samples,
        'batches': batches,
        'full_epoch': args.max_batches is None or samples >= n_rows,
        'construct_s': t_built - t0,
        'first_batch_s': t_first - t0,
        'epoch_s': t_end - t_built,
        'samples_per_s': samples / (t_end - t_built),
        'steady_samples_per_s': (samples - B) / (t_end - t_first) if batches > 1 else None,
        'peak_rss_self_kib': self_kib,
        'peak_rss_children_kib': child_kib,
        'template_state': template,
        'refs': {str(k): v for k, v in refs.items()},
        'targets': targets,
        'shuffle_algo': ds.shuffle_algo,
        'num_canonical_nodes': ds.num_canonical_nodes,
        'shuffle_block_size': ds.shuffle_block_size,
        'predownload': ds.predownload,
    }


def child_resume(args, columns, state):
    child_setup()
    t0 = time.perf_counter()
    ds, loader = make_loader(args, columns)
    loader.load_state_dict(state)
    it = iter(loader)
    try:
        first = next(it)
    except StopIteration:
        first = None
    t1 = time.perf_counter()
    out = {'first_batch_s': t1 - t0,
           'digest': batch_digest(first) if first is not None else None,
           'first_batch_len': batch_len(first) if first is not None else 0}
    del first
    it.close()
    del it
    self_kib, child_kib = peak_rss_kib()
    out.update(peak_rss_self_kib=self_kib, peak_rss_children_kib=child_kib)
    return out


# --------------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------------
def run_child(argv_base, extra):
    cmd = [sys.executable, os.path.abspath(__file__)] + argv_base + extra
    # streaming leaves <prefix>_barrier_filelock / <prefix>_cache_filelock files in
    # tempfile.gettempdir() forever, and skips any shm prefix whose filelock files exist, so the
    # prefix would grow with every run. A private TMPDIR per child keeps prefix 0 and leaves
    # nothing behind.
    tmp = tempfile.mkdtemp(prefix='bench_mosaic_')
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, TMPDIR=tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = None
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
        elif line.strip():
            print(line, file=sys.stderr)
    if p.returncode != 0 or res is None:
        raise SystemExit(f'child {extra[:2]} failed with rc={p.returncode}')
    return res


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('parquet_dir')
    p.add_argument('mds_dir')
    p.add_argument('--batch-size', type=int, default=256)
    p.add_argument('--num-workers', type=int, default=1)
    p.add_argument('--columns', default='',
                   help='comma-separated columns to convert and load (default: all)')
    p.add_argument('--resume-fraction', default='0.0,0.5,0.9',
                   help='comma-separated epoch fractions; empty string to skip')
    p.add_argument('--max-batches', type=int, default=None)
    p.add_argument('--seed', type=int, default=9176, help='shuffle_seed (streaming default 9176)')
    p.add_argument('--num-canonical-nodes', type=int, default=None,
                   help='default: streaming default (1 physical node -> 1 for py1e)')
    p.add_argument('--shuffle-algo', default=None, help="default: streaming default ('py1e')")
    p.add_argument('--predownload', type=int, default=None,
                   help='default: streaming default (8 * batch_size)')
    p.add_argument('--compression', default=None, help='MDS shard compression, e.g. zstd')
    p.add_argument('--size-limit', default='64mb', help='MDS shard size limit')
    p.add_argument('--read-batch-rows', type=int, default=8192,
                   help='pyarrow iter_batches size during conversion')
    p.add_argument('--_child', choices=['convert', 'epoch', 'resume'], help=argparse.SUPPRESS)
    p.add_argument('--_state', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.parquet_dir = os.path.abspath(a.parquet_dir)
    a.mds_dir = os.path.abspath(a.mds_dir)
    return a


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    columns = [c for c in args.columns.split(',') if c]
    fractions = [float(x) for x in args.resume_fraction.split(',') if x.strip()]

    if args._child:
        if args._child == 'convert':
            rows, secs, enc = convert(args.parquet_dir, args.mds_dir, columns,
                                      args.read_batch_rows, args.compression, args.size_limit)
            res = {'rows': rows, 'convert_s': secs, 'encodings': enc}
        elif args._child == 'epoch':
            res = child_epoch(args, columns, fractions)
        else:
            res = child_resume(args, columns, json.loads(args._state))
        print(RESULT_TAG + json.dumps(res), flush=True)
        return

    # strip any internal flags from the argv we pass on
    base = [x for x in argv if not x.startswith('--_')]

    # The parent stays lean (no torch/streaming import): on Linux a child's ru_maxrss starts
    # from the RSS of the process it was forked from (kept across exec), so a fat parent would
    # inflate every child's peak RSS. Conversion therefore runs in a child too.
    from importlib.metadata import version as _pkg_version
    version = _pkg_version('mosaicml-streaming')
    converted_now = False
    if os.path.exists(os.path.join(args.mds_dir, 'index.json')):
        log(f'{args.mds_dir}/index.json exists: skipping conversion')
        convert_s = None
        meta = os.path.join(args.mds_dir, CONVERT_META)
        if os.path.exists(meta):
            with open(meta) as fh:
                convert_s = json.load(fh).get('convert_s')
    else:
        convert_s = run_child(base, ['--_child', 'convert'])['convert_s']
        converted_now = True

    log('epoch run ...')
    ep = run_child(base, ['--_child', 'epoch'])
    log(f"epoch: {ep['samples']} samples in {ep['epoch_s']:.2f} s "
        f"({ep['samples_per_s']:.0f}/s), first batch {ep['first_batch_s']:.3f} s")

    resume = {}
    checks = {}
    for f in fractions:
        s = min(int(f * ep['rows']) // args.batch_size * args.batch_size, max(ep['rows'] - 1, 0))
        ref = ep['refs'].get(str(s))
        state = dict(ref['state']) if ref else dict(ep['template_state'], sample_in_epoch=s)
        log(f'resume f={f}: state {state}')
        r = run_child(base, ['--_child', 'resume', '--_state', json.dumps(state)])
        resume[str(f)] = r['first_batch_s']
        checks[str(f)] = {
            'sample_in_epoch': s,
            'genuine_checkpoint': bool(ref and ref['genuine']),
            'first_batch_matches_epoch_run': (r['digest'] == ref['digest']) if ref else None,
            'peak_rss_mib': round((r['peak_rss_self_kib'] + r['peak_rss_children_kib']) / 1024,
                                  1),
        }
        log(f"resume f={f}: first batch {r['first_batch_s']:.3f} s, check {checks[str(f)]}")

    out = {
        'reader': f'mosaic streaming {version}',
        'rows': ep['rows'],
        'samples_per_s': round(ep['samples_per_s'], 1),
        'first_batch_s': round(ep['first_batch_s'], 4),
        'peak_rss_mib': round((ep['peak_rss_self_kib'] + ep['peak_rss_children_kib']) / 1024, 1),
        'resume_first_batch_s': {k: round(v, 4) for k, v in resume.items()},
        'convert_s': round(convert_s, 3) if convert_s is not None else None,
        'details': {
            'converted_now': converted_now,
            'batch_size': args.batch_size,
            'num_workers': args.num_workers,
            'samples': ep['samples'],
            'batches': ep['batches'],
            'full_epoch': ep['full_epoch'],
            'construct_s': round(ep['construct_s'], 4),
            'epoch_s': round(ep['epoch_s'], 3),
            'steady_samples_per_s': (round(ep['steady_samples_per_s'], 1)
                                     if ep['steady_samples_per_s'] else None),
            'peak_rss_self_mib': round(ep['peak_rss_self_kib'] / 1024, 1),
            'peak_rss_children_mib': round(ep['peak_rss_children_kib'] / 1024, 1),
            'shuffle_algo': ep['shuffle_algo'],
            'num_canonical_nodes': ep['num_canonical_nodes'],
            'shuffle_block_size': ep['shuffle_block_size'],
            'predownload': ep['predownload'],
            'resume_checks': checks,
        },
    }
    print(json.dumps(out), flush=True)


if __name__ == '__main__':
    main()
