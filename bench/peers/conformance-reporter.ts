// A node:test reporter for the conformance section: one JSON line per finished test or suite,
// with its full name and, for a failure, the error's message (a suite's is its hook's: its
// tests are then cancelled).

interface TestEvent {
  readonly type: string;
  readonly data: { name: string; nesting: number; details?: { type?: string; error?: { message?: string; cause?: { message?: string } } } };
}

export default async function* reporter(source: AsyncIterable<TestEvent>): AsyncGenerator<string> {
  const stack: string[] = [];
  for await (const ev of source) {
    if (ev.type === 'test:start') {
      stack[ev.data.nesting] = ev.data.name;
      stack.length = ev.data.nesting + 1;
      continue;
    }
    if (ev.type !== 'test:pass' && ev.type !== 'test:fail') continue;
    const suite = ev.data.details?.type === 'suite';
    const name = [...stack.slice(0, ev.data.nesting), ev.data.name].join(' > ');
    const err = ev.data.details?.error;
    const message = err?.cause?.message ?? err?.message;
    yield `${JSON.stringify({ name, ok: ev.type === 'test:pass', suite, message })}\n`;
  }
}
