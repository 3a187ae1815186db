"""Packs the contents of wheels as independent xz streams and unpacks them
with Python's standard library only (the GPU machine has no xz or zstd
command known). pack_wheels.sh and run_check.sh call it; see README.md here.

    python3 benchmarks/device/sitepack.py pack WHEELS_DIR OUT_DIR [--drop=GLOB ...]
    python3 benchmarks/device/sitepack.py unpack OUT_DIR/site.json SITE [--jobs=16]

`pack` lays the files of every wheel (the folder that unzipping each wheel
into one folder makes) end to end in path order and cuts them into streams
of at most `--stream_bytes`, each compressed on its own with lzma preset 6
(a large library spans several streams), so that `unpack` decompresses one
stream a thread. `OUT_DIR/site.json` lists the files (path, size, mode) and
each stream's parts (file, offset, length); `OUT_DIR/site/` holds the streams.
Where two wheels hold the same path (`nvidia/__init__.py`), the last wheel in
name order wins.
"""
import argparse
import concurrent.futures
import fnmatch
import json
import lzma
import os
import sys
import zipfile

FORMAT = 1
STREAM_BYTES = 64 << 20
PRESET = 6
READ_BYTES = 1 << 20


class PackError(Exception):
    """Bad input: one `error:` line, exit status 2."""


def _checked(path):
    """`path` if it is a relative path that stays inside its folder."""
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or "\\" in path:
        raise PackError(f"unsafe path {path!r} in a wheel or index")
    return path


def plan(wheels, drop=()):
    """The files of `wheels` as one folder holds them, without the `drop` ones.

    Args:
        wheels: paths of .whl files; later ones win on a path two hold.
        drop: fnmatch patterns of paths to leave out.

    Returns:
        (files, sources): files is a path-sorted list of [path, size, mode];
        sources[i] is (wheel, member name) of files[i].
    """
    chosen = {}
    for wheel in sorted(wheels, key=os.path.basename):
        try:
            infos = zipfile.ZipFile(wheel).infolist()
        except (OSError, zipfile.BadZipFile) as err:
            raise PackError(f"{wheel}: not a readable wheel ({err})") from None
        for info in infos:
            if info.is_dir() or any(fnmatch.fnmatchcase(info.filename, p) for p in drop):
                continue
            mode = (info.external_attr >> 16) & 0o777 | 0o644  # readable by all
            chosen[_checked(info.filename)] = (info.file_size, mode, wheel, info.filename)
    paths = sorted(chosen)
    return ([[p, chosen[p][0], chosen[p][1]] for p in paths],
            [chosen[p][2:] for p in paths])


def split(sizes, stream_bytes):
    """Cuts files laid end to end into streams of at most `stream_bytes`.

    Args:
        sizes: each file's bytes, in order.
        stream_bytes: the most raw bytes a stream holds (> 0).

    Returns:
        one list per stream of [file index, offset in the file, length];
        empty files are in no stream.
    """
    streams, current, room = [], [], stream_bytes
    for index, size in enumerate(sizes):
        offset = 0
        while offset < size:
            length = min(size - offset, room)
            current.append([index, offset, length])
            offset += length
            room -= length
            if room == 0:
                streams.append(current)
                current, room = [], stream_bytes
    if current:
        streams.append(current)
    return streams


def _compress(data, path, preset):
    with open(path, "wb") as out:
        out.write(lzma.compress(data, preset=preset))
    return len(data)


def pack(wheels, out_dir, drop=(), stream_bytes=STREAM_BYTES, preset=PRESET, jobs=None):
    """Writes `out_dir/site.json` and the streams `out_dir/site/NNNN.xz`.

    Args:
        wheels: paths of .whl files.
        out_dir: the folder to write (its site/ is replaced).
        drop: fnmatch patterns of paths to leave out.
        stream_bytes: the most raw bytes a stream holds.
        preset: the lzma preset.
        jobs: streams compressed at once (default: the CPUs).

    Returns:
        the index written (the JSON of site.json).
    """
    if stream_bytes <= 0:
        raise PackError(f"--stream_bytes must be positive, not {stream_bytes}")
    files, sources = plan(wheels, drop)
    streams = split([size for _, size, _ in files], stream_bytes)
    folder = os.path.join(out_dir, "site")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    jobs = jobs or os.cpu_count() or 1
    names = [f"site/{i:04d}.xz" for i in range(len(streams))]
    archives, reading = {}, None
    # one thread reads the wheels in order; lzma releases the GIL, so `jobs` compress
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        pending = []
        for name, parts in zip(names, streams):
            data = bytearray()
            for index, offset, length in parts:
                wheel, member = sources[index]
                if offset == 0:
                    if wheel not in archives:
                        archives[wheel] = zipfile.ZipFile(wheel)
                    reading = archives[wheel].open(member)
                chunk = reading.read(length)
                if len(chunk) != length:
                    raise PackError(f"{wheel}: {member} is shorter than its zip entry says")
                data += chunk
            pending.append(pool.submit(_compress, bytes(data), os.path.join(out_dir, name),
                                       preset))
            while len(pending) > jobs:  # at most jobs + 1 streams held in memory
                pending.pop(0).result()
        for future in pending:
            future.result()
    index = {"format": FORMAT, "files": files,
             "streams": [{"name": n, "parts": p} for n, p in zip(names, streams)]}
    with open(os.path.join(out_dir, "site.json"), "w", encoding="utf-8") as out:
        json.dump(index, out)
    return index


def _unpack_stream(base, stream, targets):
    """Decompresses one stream into its files' byte ranges; returns its raw bytes."""
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    parts = iter(stream["parts"])
    part, written, total = None, 0, 0
    fd = None  # the open file of `part` only: a stream holds thousands of small files
    try:
        with open(os.path.join(base, _checked(stream["name"])), "rb") as source:
            while not decompressor.eof:
                compressed = source.read(READ_BYTES)
                if not compressed:
                    raise PackError(f"{stream['name']} ends before its xz stream does")
                data = memoryview(decompressor.decompress(compressed))
                while data:
                    if part is None or written == part[2]:
                        part, written = next(parts, None), 0
                        if fd is not None:
                            os.close(fd)
                            fd = None
                        if part is None:
                            raise PackError(f"{stream['name']} holds more bytes than site.json "
                                            "lists")
                        fd = os.open(targets[part[0]], os.O_WRONLY)
                    take = min(len(data), part[2] - written)
                    os.pwrite(fd, data[:take], part[1] + written)
                    written += take
                    total += take
                    data = data[take:]
            if source.read(1):
                raise PackError(f"{stream['name']} has bytes after its xz stream")
    except lzma.LZMAError as err:
        raise PackError(f"{stream['name']}: {err}") from None
    finally:
        if fd is not None:
            os.close(fd)
    if (part is not None and written != part[2]) or next(parts, None) is not None:
        raise PackError(f"{stream['name']} holds fewer bytes than site.json lists")
    return total


def unpack(index_path, site, jobs=None):
    """Recreates the files of `index_path` (site.json) under `site`.

    Args:
        index_path: the site.json that `pack` wrote, beside its site/ streams.
        site: the folder to write the files into (made if missing).
        jobs: streams decompressed at once (default: the CPUs).

    Returns:
        (files, raw bytes) written.
    """
    try:
        with open(index_path, encoding="utf-8") as source:
            index = json.load(source)
    except (OSError, ValueError) as err:
        raise PackError(f"{index_path}: not a site index ({err})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise PackError(f"{index_path}: not a format-{FORMAT} site index; pack the wheels "
                        "again with this checkout's pack_wheels.sh")
    try:
        files = [(str(p), int(s), int(m)) for p, s, m in index["files"]]
        streams = [{"name": str(s["name"]), "parts": [[int(i), int(o), int(n)]
                                                      for i, o, n in s["parts"]]}
                   for s in index["streams"]]
        if any(not 0 <= i < len(files) for s in streams for i, _, _ in s["parts"]):
            raise ValueError("a part names no file")
    except (KeyError, TypeError, ValueError) as err:
        raise PackError(f"{index_path}: not a site index ({err})") from None
    targets = []
    for path, size, mode in files:
        target = os.path.join(site, _checked(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.truncate(size)
        os.chmod(target, mode)
        targets.append(target)
    sizes = {}
    for stream in streams:
        for i, _, length in stream["parts"]:
            sizes[i] = sizes.get(i, 0) + length
    short = [files[i][0] for i, (_, size, _) in enumerate(files) if sizes.get(i, 0) != size]
    if short:
        raise PackError(f"{index_path}: the streams do not cover {short[0]} "
                        f"({len(short)} files)")
    base = os.path.dirname(os.path.abspath(index_path))
    with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        done = pool.map(lambda s: _unpack_stream(base, s, targets), streams)
        total = sum(done)
    return len(files), total


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    parser = _Parser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("wheels_dir")
    packing.add_argument("out_dir")
    packing.add_argument("--drop", action="append", default=[],
                         help="fnmatch pattern of paths to leave out (repeatable)")
    packing.add_argument("--stream_bytes", type=int, default=STREAM_BYTES)
    packing.add_argument("--preset", type=int, default=PRESET, choices=range(10))
    packing.add_argument("--jobs", type=int, default=None)
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("index")
    unpacking.add_argument("site")
    unpacking.add_argument("--jobs", type=int, default=None)
    for sub in (packing, unpacking):
        sub.error = parser.error
    o = parser.parse_args(argv)
    try:
        if o.jobs is not None and o.jobs < 1:
            raise PackError(f"--jobs must be at least 1, not {o.jobs}")
        if o.command == "pack":
            wheels = sorted(os.path.join(o.wheels_dir, n) for n in os.listdir(o.wheels_dir)
                            if n.endswith(".whl")) if os.path.isdir(o.wheels_dir) else None
            if not wheels:
                raise PackError(f"{o.wheels_dir} holds no .whl files")
            index = pack(wheels, o.out_dir, o.drop, o.stream_bytes, o.preset, o.jobs)
            raw = sum(size for _, size, _ in index["files"])
            packed = sum(os.path.getsize(os.path.join(o.out_dir, s["name"]))
                         for s in index["streams"])
            print(f"packed {len(index['files'])} files of {len(wheels)} wheels, {raw:,} bytes, "
                  f"into {len(index['streams'])} xz streams of {packed:,} bytes")
        else:
            count, total = unpack(o.index, o.site, o.jobs)
            print(f"unpacked {count} files, {total:,} bytes, into {o.site}")
    except (PackError, OSError, zipfile.BadZipFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
