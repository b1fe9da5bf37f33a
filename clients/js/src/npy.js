// A reader for NumPy's .npy format (versions 1.0 to 3.0): a magic string, a little-endian header
// length, an ASCII header dict, then the raw array. Only what the client bundle uses: C order,
// little-endian float64, int64 and int32.

const MAGIC = '\x93NUMPY';
const DTYPES = {
  '<f8': { size: 8, read: (buf) => new Float64Array(buf) },
  '<i4': { size: 4, read: (buf) => new Int32Array(buf) },
  // int64 offsets and indices are far below 2^53: plain numbers are exact and faster than BigInt.
  '<i8': { size: 8, read: (buf) => Float64Array.from(new BigInt64Array(buf), Number) },
};

function fail(name, what) {
  throw new Error(`${name}: ${what}; expected a NumPy .npy file (little-endian <f8, <i8 or <i4, C order)`);
}

// Parses the bytes of one .npy file; returns { dtype, shape, data } with data a typed array.
export function parseNpy(bytes, name = 'array') {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (b.length < 10 || String.fromCharCode(...b.subarray(0, 6)) !== MAGIC) fail(name, 'no .npy magic string');
  const major = b[6];
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  let headerLen, start;
  if (major === 1) {
    headerLen = view.getUint16(8, true);
    start = 10;
  } else if (major === 2 || major === 3) {
    headerLen = view.getUint32(8, true);
    start = 12;
  } else {
    fail(name, `unsupported .npy version ${major}`);
  }
  const header = new TextDecoder('latin1').decode(b.subarray(start, start + headerLen));
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const order = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !order || !shape) fail(name, 'a header without descr, fortran_order or shape');
  const dtype = DTYPES[descr[1]];
  if (!dtype) fail(name, `dtype ${descr[1]}`);
  if (order[1] !== 'False') fail(name, 'Fortran order');
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
  const count = dims.reduce((a, x) => a * x, 1);
  const offset = start + headerLen;
  if (b.length - offset !== count * dtype.size) {
    fail(name, `${b.length - offset} data bytes for shape (${dims.join(', ')}) of ${descr[1]}`);
  }
  // Copy: the typed array needs its own aligned buffer.
  const data = dtype.read(new Uint8Array(b.subarray(offset)).buffer);
  return { dtype: descr[1], shape: dims, data };
}
