// A real Flink DataStream job that keeps keyed state in RocksDB and takes retained incremental
// checkpoints, for the ckptfs import of Flink checkpoints (chk-N/_metadata + shared/<uuid>).
// scripts/make-flink-fixtures runs it to make tests/fixtures/flink/job1/.
//
// Build and run (Flink 2.3's jars; scripts/env.sh's ckptfs_install_flink_jars sets
// CKPTFS_FLINK_LIB):
//
//   javac -cp "$CKPTFS_FLINK_LIB/*" -d CLASSDIR tests/flink/StateJob.java
//   java -cp "$CKPTFS_FLINK_LIB/*:CLASSDIR" StateJob CHECKPOINT_DIR [options]
//   java -cp "$CKPTFS_FLINK_LIB/*:CLASSDIR" StateJob --expected [options]
//
// Options (--name value):
//   --keys K               keys k0..k{K-1}, emitted round-robin (default 50)
//   --rate R               records per second emitted by the source (default 200)
//   --records N            stop emitting after N records; 0 = never stop (default 0)
//   --after idle|finish    once N records are out: keep the job running with the source idle, so
//                          the state stops changing while checkpoints go on (idle, default), or
//                          let the source return, so that the job FINISHES (finish)
//   --interval-ms MS       execution.checkpointing.interval (default 1000)
//   --retained R           execution.checkpointing.num-retained (default 3)
//   --timeout-ms MS        execution.checkpointing.timeout (default: Flink's, 10 min): a checkpoint
//                          not complete this long after its trigger is aborted
//   --parallelism P        parallelism.default of the keyed operators (default 2)
//   --max-parallelism M    pipeline.max-parallelism (default 128, also Flink's own default for
//                          parallelism 2: max(128, roundUpToPowerOfTwo(P + P/2)))
//   --inline-threshold B   execution.checkpointing.data-inline-threshold in bytes (default: Flink's,
//                          20 kb): state files up to this size are inlined into _metadata
//   --incremental BOOL     execution.checkpointing.incremental (default true; false: full
//                          snapshots, which Flink 2.3 writes in RocksDB's own format too, every file
//                          of the database in chk-N/ each time)
//   --file-merging BOOL    execution.checkpointing.file-merging.enabled (default false; true: every
//                          state file a segment of a shared physical file, FLIP-306)
//   --file-merging-across BOOL
//                          execution.checkpointing.file-merging.across-checkpoint-boundary (default
//                          false; true: also turns file merging on, and a physical file stays open in
//                          its pool after a checkpoint, appended to by later checkpoints until it
//                          reaches file-merging.max-file-size, 32 MB)
//   --stall C:MS           checkpoint C expires after the source and "counter" wrote their state for
//                          it ("totals" holds its barrier for the timeout and 1.5 s more; needs
//                          --timeout-ms), then the source holds checkpoint C+1's barrier for MS
//                          milliseconds: meanwhile every checkpoint expires with nothing written for
//                          it, as under backpressure (tolerable-failed-checkpoints is then unbounded,
//                          so the job goes on)
//   --state-backend NAME   state.backend.type (default rocksdb; hashmap: the heap backend, whose
//                          keyed snapshots are streams of key groups, not RocksDB files; forst:
//                          Flink 2's ForSt, a RocksDB fork, whose snapshots are RocksDB files too)
//   --restore PATH         execution.state-recovery.path: start from the checkpoint (or savepoint)
//                          directory PATH (the one holding _metadata); the source goes on from
//                          the number of records it had emitted, each key's state from what it
//                          held
//   --claim-mode MODE      execution.state-recovery.claim-mode with --restore: CLAIM (the job owns
//                          the restored checkpoint and its incremental checkpoints go on naming
//                          the restored files where they are) or NO_CLAIM (Flink's default)
//   --job-id HEX           the job's id, 32 hex digits ($internal.pipeline.job-id, Flink's
//                          PipelineOptionsInternal.PIPELINE_FIXED_JOB_ID, what application mode on
//                          Kubernetes sets): default a random one. A job restored under the
//                          id of the job it came from writes into the same <job-id>/ directory,
//                          its checkpoint ids going on from the restored one's
//   --payload-bytes B      B > 0: "counter" also keeps per key a B-byte payload, rewritten with
//                          every record (default 0: no payload state at all), so that the keyed
//                          state is about K x B bytes and changes with every record (benchmarks)
//   --linger-ms MS         after the job finished, wait MS before the JVM exits (default 5000):
//                          Flink discards a finished job's checkpoints asynchronously, and an
//                          immediate exit leaves part of them behind
//
// The job runs on a local mini cluster (StreamExecutionEnvironment.getExecutionEnvironment(conf)
// in a plain JVM) with the RocksDB state backend, incremental checkpoints into
// file://CHECKPOINT_DIR/<job-id>/ and RETAIN_ON_CANCELLATION. Flink keeps the newest R completed
// checkpoints only while the job does not reach FINISHED: a finished job discards them (its
// CheckpointProperties have discardFinished=true). So to keep them, SIGKILL the JVM.
//
// Topology:
//   source (parallelism 1, uid "source"): record i = ("k" + (i % K), i) for i = 0, 1, 2, ...,
//       throttled to R records/s; operator ListState "emitted" = records emitted so far.
//   -> keyBy(f0) -> "counter" (KeyedProcessFunction, uid "counter"), per key:
//       ValueState<Long> "count": records seen; MapState<Long, Long> "seqs": the n-th record
//       (n = 0, 1, ...) of the key -> its sequence number i. So "count" has one entry per key
//       seen and "seqs" one entry per record. With --payload-bytes B > 0 also
//       ValueState<byte[]> "payload": B bytes, rewritten on every record with bytes that do not
//       compress (xorshift64* seeded by the record's sequence number i), one entry per key seen.
//   -> keyBy(f0) -> "totals" (RichFlatMapFunction, no uid: Flink derives its operator id from
//       the graph), per key: ValueState<Long> "sum": sum of the i; MapState<String, Long>
//       "rounds": "r" + ((i / K) % 4) -> records in that bucket, so min(count, 4) entries per
//       key; ListState<Long> "recent": every i (one RocksDB entry per key, built by merges).
//   -> discarding sink (chained to "totals").
// Aligned exactly-once checkpoints: the state in checkpoint C is exactly that of the first
// "emitted" records, the number the source printed for C.
//
// Stdout (nothing per record): "config KEY=VALUE" per setting, "job JOBID", "restored records M"
// when the source starts from restored state (M records emitted before), "snapshot C records
// M" when the source snapshots checkpoint C (M records emitted before its barrier), "complete C"
// when checkpoint C is complete, "idle M" once the source stopped emitting, "mismatch ..." if
// "counter" finds a key's count not what the records before it make it (state lost or restored
// wrong), "stall C" as checkpoint C's barrier is held (--stall), and "finished" if the job
// finished. Any error: a message on stderr, exit 1.
//
// --expected prints, without running Flink, what the keyed state holds after M = --records
// records: "key NAME keyGroup G subtask S records N" per key and "state OPERATOR NAME subtask S
// entries E" per (operator, state, subtask): E = RocksDB entries in that state's column family
// of that subtask (subtask S owns key groups [S*M/P, (S+1)*M/P - 1], Flink's
// KeyGroupRangeAssignment); "state counter payload subtask S entries E" only when
// --payload-bytes is above 0.

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.ExternalizedCheckpointRetention;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.functions.source.legacy.RichSourceFunction;
import org.apache.flink.util.Collector;

public final class StateJob {
    static final TypeInformation<Tuple2<String, Long>> RECORD = Types.TUPLE(Types.STRING, Types.LONG);

    /** Buckets of the "rounds" map state of "totals". */
    static final int ROUND_BUCKETS = 4;

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** Emits ("k" + (i % keys), i), throttled; keeps the number emitted as operator state. */
    static final class KeySource extends RichSourceFunction<Tuple2<String, Long>>
            implements CheckpointedFunction, CheckpointListener {
        private final int keys;
        private final double rate;
        private final long records;
        private final boolean finish;
        private final long[] stall;
        private transient ListState<Long> emittedState;
        private long emitted;
        private volatile boolean running = true;

        KeySource(int keys, double rate, long records, boolean finish, long[] stall) {
            this.keys = keys;
            this.rate = rate;
            this.records = records;
            this.finish = finish;
            this.stall = stall;
        }

        @Override
        public void run(SourceContext<Tuple2<String, Long>> ctx) throws Exception {
            final Object lock = ctx.getCheckpointLock();
            final long start = System.nanoTime();
            final long base = emitted;
            while (running && (records <= 0 || emitted < records)) {
                long due = start + (long) ((emitted - base) * 1e9 / rate);
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                }
                synchronized (lock) {
                    ctx.collect(Tuple2.of("k" + (emitted % keys), emitted));
                    emitted++;
                }
            }
            if (!running) {
                return;
            }
            synchronized (lock) {
                say("idle " + emitted);
            }
            if (finish) {
                return;
            }
            while (running) {
                Thread.sleep(100);
            }
        }

        @Override
        public void cancel() {
            running = false;
        }

        @Override
        public void initializeState(FunctionInitializationContext context) throws Exception {
            emittedState = context.getOperatorStateStore()
                    .getListState(new ListStateDescriptor<>("emitted", Types.LONG));
            for (Long n : emittedState.get()) {
                emitted += n;
            }
            if (context.isRestored()) {
                say("restored records " + emitted);
            }
        }

        @Override
        public void snapshotState(FunctionSnapshotContext context) throws Exception {
            long id = context.getCheckpointId();
            if (stall[0] > 0 && id == stall[0] + 1) {
                say("stall " + id);
                Thread.sleep(stall[1]);
            }
            // Called under the checkpoint lock: no record is emitted meanwhile.
            emittedState.update(List.of(emitted));
            say("snapshot " + id + " records " + emitted);
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            say("complete " + checkpointId);
        }
    }

    /**
     * uid "counter": a counter per key and every record's sequence number; with payloadBytes
     * above 0 also a payload per key, rewritten by every record.
     */
    static final class Counter
            extends KeyedProcessFunction<String, Tuple2<String, Long>, Tuple2<String, Long>> {
        private final int payloadBytes;
        private final int keys;
        private transient boolean mismatchSaid;
        private transient ValueState<Long> count;
        private transient MapState<Long, Long> seqs;
        private transient ValueState<byte[]> payload;

        Counter(int payloadBytes, int keys) {
            this.payloadBytes = payloadBytes;
            this.keys = keys;
        }

        @Override
        public void open(OpenContext openContext) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
            seqs = getRuntimeContext()
                    .getMapState(new MapStateDescriptor<>("seqs", Types.LONG, Types.LONG));
            // Registered only when used: with no payload the state is what it always was.
            if (payloadBytes > 0) {
                payload = getRuntimeContext().getState(new ValueStateDescriptor<>("payload",
                        PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
            }
        }

        @Override
        public void processElement(Tuple2<String, Long> rec, Context ctx,
                Collector<Tuple2<String, Long>> out) throws Exception {
            Long n = count.value();
            long seen = n == null ? 0 : n;
            // Record i is the (i / K)-th of its key: a count that says otherwise is state
            // lost or restored wrong (said once per subtask).
            if (seen != rec.f1 / keys && !mismatchSaid) {
                mismatchSaid = true;
                say("mismatch key " + rec.f0 + " record " + rec.f1 + " count " + seen
                        + " expected " + (rec.f1 / keys));
            }
            seqs.put(seen, rec.f1);
            count.update(seen + 1);
            if (payloadBytes > 0) {
                payload.update(payloadOf(rec.f1, payloadBytes));
            }
            out.collect(rec);
        }
    }

    /**
     * The payload of record i: xorshift64* seeded by the SplitMix64 finalizer of i, so
     * deterministic and incompressible.
     */
    static byte[] payloadOf(long i, int bytes) {
        long x = i + 0x9E3779B97F4A7C15L;
        x = (x ^ (x >>> 30)) * 0xBF58476D1CE4E5B9L;
        x = (x ^ (x >>> 27)) * 0x94D049BB133111EBL;
        x = (x ^ (x >>> 31)) | 1;
        byte[] out = new byte[bytes];
        for (int at = 0; at < bytes; at += 8) {
            x ^= x >>> 12;
            x ^= x << 25;
            x ^= x >>> 27;
            long word = x * 0x2545F4914F6CDD1DL;
            for (int b = 0; b < 8 && at + b < bytes; b++) {
                out[at + b] = (byte) (word >>> (8 * b));
            }
        }
        return out;
    }

    /** No uid: a sum, a bucketed map and a list per key. */
    static final class Totals extends RichFlatMapFunction<Tuple2<String, Long>, Long>
            implements CheckpointedFunction {
        private final int keys;
        private final long[] stall;
        private transient ValueState<Long> sum;
        private transient MapState<String, Long> rounds;
        private transient ListState<Long> recent;

        Totals(int keys, long[] stall) {
            this.keys = keys;
            this.stall = stall;
        }

        @Override
        public void initializeState(FunctionInitializationContext context) {}

        @Override
        public void snapshotState(FunctionSnapshotContext context) throws Exception {
            long id = context.getCheckpointId();
            if (id == stall[0]) {
                say("stall " + id);
                Thread.sleep(stall[2] + 1500);
            }
        }

        @Override
        public void open(OpenContext openContext) {
            sum = getRuntimeContext().getState(new ValueStateDescriptor<>("sum", Types.LONG));
            rounds = getRuntimeContext()
                    .getMapState(new MapStateDescriptor<>("rounds", Types.STRING, Types.LONG));
            recent = getRuntimeContext().getListState(new ListStateDescriptor<>("recent", Types.LONG));
        }

        @Override
        public void flatMap(Tuple2<String, Long> rec, Collector<Long> out) throws Exception {
            Long s = sum.value();
            sum.update((s == null ? 0 : s) + rec.f1);
            String bucket = "r" + ((rec.f1 / keys) % ROUND_BUCKETS);
            Long c = rounds.get(bucket);
            rounds.put(bucket, (c == null ? 0 : c) + 1);
            recent.add(rec.f1);
        }
    }

    static final class ByKey implements KeySelector<Tuple2<String, Long>, String> {
        @Override
        public String getKey(Tuple2<String, Long> rec) {
            return rec.f0;
        }
    }

    static void fail(String message) {
        System.err.println("StateJob: " + message);
        System.exit(1);
    }

    static final String USAGE = "usage: StateJob CHECKPOINT_DIR | --expected  [--keys K] [--rate R]"
            + " [--records N] [--after idle|finish] [--interval-ms MS] [--retained R] [--timeout-ms MS]"
            + " [--parallelism P] [--max-parallelism M] [--inline-threshold BYTES] [--linger-ms MS]"
            + " [--restore PATH] [--payload-bytes B] [--incremental BOOL] [--state-backend NAME]"
            + " [--file-merging BOOL] [--file-merging-across BOOL] [--claim-mode CLAIM|NO_CLAIM]"
            + " [--stall C:MS] [--job-id HEX]";

    public static void main(String[] args) throws Exception {
        String dir = null;
        boolean expected = false;
        Map<String, String> opts = new HashMap<>();
        List<String> known = List.of("--incremental", "--state-backend", "--file-merging", "--keys", "--rate", "--records", "--after", "--interval-ms",
                "--retained", "--timeout-ms", "--parallelism", "--max-parallelism", "--inline-threshold", "--linger-ms",
                "--restore", "--payload-bytes", "--claim-mode", "--file-merging-across",
                "--stall", "--job-id");
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--expected")) {
                expected = true;
            } else if (known.contains(a)) {
                if (i + 1 >= args.length) {
                    fail(a + " needs a value\n" + USAGE);
                }
                opts.put(a, args[++i]);
            } else if (a.startsWith("--") || dir != null) {
                fail("unknown argument " + a + "\n" + USAGE);
            } else {
                dir = a;
            }
        }
        if (dir == null && !expected) {
            fail(USAGE);
        }
        int keys = 0, parallelism = 0, maxParallelism = 0, retained = 0, payloadBytes = 0;
        long records = 0, intervalMs = 0, inlineThreshold = -1, lingerMs = 0;
        double rate = 0;
        // --stall C:MS and the timeout; none by default.
        long[] stall = {-1, -1, -1};
        String after = opts.getOrDefault("--after", "idle");
        try {
            keys = Integer.parseInt(opts.getOrDefault("--keys", "50"));
            rate = Double.parseDouble(opts.getOrDefault("--rate", "200"));
            records = Long.parseLong(opts.getOrDefault("--records", "0"));
            intervalMs = Long.parseLong(opts.getOrDefault("--interval-ms", "1000"));
            retained = Integer.parseInt(opts.getOrDefault("--retained", "3"));
            parallelism = Integer.parseInt(opts.getOrDefault("--parallelism", "2"));
            maxParallelism = Integer.parseInt(opts.getOrDefault("--max-parallelism", "128"));
            lingerMs = Long.parseLong(opts.getOrDefault("--linger-ms", "5000"));
            payloadBytes = Integer.parseInt(opts.getOrDefault("--payload-bytes", "0"));
            if (opts.containsKey("--stall")) {
                String[] parts = opts.get("--stall").split(":", 2);
                stall[0] = Long.parseLong(parts[0]);
                stall[1] = parts.length == 2 ? Long.parseLong(parts[1]) : -1;
                stall[2] = Long.parseLong(opts.getOrDefault("--timeout-ms", "-1"));
            }
            if (opts.containsKey("--inline-threshold")) {
                inlineThreshold = Long.parseLong(opts.get("--inline-threshold"));
            }
        } catch (NumberFormatException e) {
            fail("bad number: " + e.getMessage() + "\n" + USAGE);
        }
        if (keys < 1 || rate <= 0 || records < 0 || intervalMs < 10 || retained < 1 || lingerMs < 0
                || payloadBytes < 0
                || (opts.containsKey("--stall") && (stall[0] < 1 || stall[1] < 0 || stall[2] < 0))
                || parallelism < 1 || maxParallelism < parallelism
                || !(after.equals("idle") || after.equals("finish"))
                || !opts.getOrDefault("--job-id", "0".repeat(32)).matches("[0-9a-f]{32}")
                || !List.of("true", "false").contains(opts.getOrDefault("--incremental", "true"))
                || !List.of("true", "false").contains(opts.getOrDefault("--file-merging", "false"))
                || !List.of("true", "false").contains(opts.getOrDefault("--file-merging-across", "false"))
                || !List.of("rocksdb", "hashmap", "forst").contains(opts.getOrDefault("--state-backend", "rocksdb"))) {
            fail("bad option value\n" + USAGE);
        }

        if (expected) {
            printExpected(keys, records, parallelism, maxParallelism, payloadBytes);
            return;
        }

        String uri = dir.startsWith("file:") ? dir
                : "file://" + java.nio.file.Paths.get(dir).toAbsolutePath().normalize();
        Configuration conf = new Configuration();
        List<String> shown = new ArrayList<>();
        set(conf, shown, StateBackendOptions.STATE_BACKEND,
                opts.getOrDefault("--state-backend", "rocksdb"));
        set(conf, shown, CheckpointingOptions.INCREMENTAL_CHECKPOINTS,
                !opts.getOrDefault("--incremental", "true").equals("false"));
        set(conf, shown, CheckpointingOptions.CHECKPOINTS_DIRECTORY, uri);
        set(conf, shown, CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(intervalMs));
        set(conf, shown, CheckpointingOptions.MAX_RETAINED_CHECKPOINTS, retained);
        if (opts.containsKey("--timeout-ms")) {
            set(conf, shown, CheckpointingOptions.CHECKPOINTING_TIMEOUT,
                    Duration.ofMillis(Long.parseLong(opts.get("--timeout-ms"))));
        }
        set(conf, shown, CheckpointingOptions.EXTERNALIZED_CHECKPOINT_RETENTION,
                ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION);
        if (inlineThreshold >= 0) {
            set(conf, shown, CheckpointingOptions.FS_SMALL_FILE_THRESHOLD,
                    new MemorySize(inlineThreshold));
        }
        boolean across = opts.getOrDefault("--file-merging-across", "false").equals("true");
        if (across || opts.getOrDefault("--file-merging", "false").equals("true")) {
            set(conf, shown, CheckpointingOptions.FILE_MERGING_ENABLED, true);
        }
        if (across) {
            set(conf, shown, CheckpointingOptions.FILE_MERGING_ACROSS_BOUNDARY, true);
        }
        if (opts.containsKey("--stall")) {
            set(conf, shown, CheckpointingOptions.TOLERABLE_FAILURE_NUMBER, Integer.MAX_VALUE);
        }
        if (opts.containsKey("--restore")) {
            set(conf, shown, StateRecoveryOptions.SAVEPOINT_PATH, opts.get("--restore"));
        }
        if (opts.containsKey("--claim-mode")) {
            set(conf, shown, StateRecoveryOptions.RESTORE_MODE,
                    org.apache.flink.core.execution.RecoveryClaimMode.valueOf(opts.get("--claim-mode")));
        }
        if (opts.containsKey("--job-id")) {
            set(conf, shown, org.apache.flink.configuration.PipelineOptionsInternal.PIPELINE_FIXED_JOB_ID,
                    opts.get("--job-id"));
        }
        set(conf, shown, CoreOptions.DEFAULT_PARALLELISM, parallelism);
        set(conf, shown, PipelineOptions.MAX_PARALLELISM, maxParallelism);
        // A failure fails the job instead of restarting it forever.
        set(conf, shown, RestartStrategyOptions.RESTART_STRATEGY, "none");
        for (String line : shown) {
            say("config " + line);
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        DataStream<Tuple2<String, Long>> source = env
                .addSource(new KeySource(keys, rate, records, after.equals("finish"), stall),
                        "source", RECORD)
                .uid("source")
                .setParallelism(1);
        DataStream<Tuple2<String, Long>> counted = source
                .keyBy(new ByKey(), Types.STRING)
                .process(new Counter(payloadBytes, keys), RECORD)
                .uid("counter")
                .name("counter");
        counted
                .keyBy(new ByKey(), Types.STRING)
                .flatMap(new Totals(keys, stall), Types.LONG)
                .name("totals")
                .sinkTo(new DiscardingSink<>())
                .name("discard");

        JobClient client = env.executeAsync("StateJob");
        say("job " + client.getJobID());
        try {
            client.getJobExecutionResult().get();
        } catch (Exception e) {
            System.err.println("StateJob: the job failed: " + e);
            e.printStackTrace();
            System.exit(1);
        }
        say("finished");
        // The job's end discards its checkpoints asynchronously (CheckpointsCleaner): give that
        // time to run before the JVM exits, else part of them stays behind.
        Thread.sleep(lingerMs);
        System.exit(0);
    }

    static <T> void set(Configuration conf, List<String> shown, ConfigOption<T> option, T value) {
        conf.set(option, value);
        shown.add(option.key() + "=" + value);
    }

    static void printExpected(int keys, long records, int parallelism, int maxParallelism,
            int payloadBytes) {
        // per subtask: [keys seen, records, sum over keys of min(count, ROUND_BUCKETS)]
        long[][] perSubtask = new long[parallelism][3];
        Map<Integer, String> lines = new TreeMap<>();
        for (int k = 0; k < keys; k++) {
            String key = "k" + k;
            long count = records / keys + (k < records % keys ? 1 : 0);
            int keyGroup = KeyGroupRangeAssignment.assignToKeyGroup(key, maxParallelism);
            int subtask = KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup(
                    maxParallelism, parallelism, keyGroup);
            lines.put(k, "key " + key + " keyGroup " + keyGroup + " subtask " + subtask
                    + " records " + count);
            if (count > 0) {
                perSubtask[subtask][0]++;
                perSubtask[subtask][1] += count;
                perSubtask[subtask][2] += Math.min(count, ROUND_BUCKETS);
            }
        }
        lines.values().forEach(System.out::println);
        for (int s = 0; s < parallelism; s++) {
            long[] p = perSubtask[s];
            System.out.println("state counter count subtask " + s + " entries " + p[0]);
            System.out.println("state counter seqs subtask " + s + " entries " + p[1]);
            if (payloadBytes > 0) {
                System.out.println("state counter payload subtask " + s + " entries " + p[0]);
            }
            System.out.println("state totals sum subtask " + s + " entries " + p[0]);
            System.out.println("state totals rounds subtask " + s + " entries " + p[2]);
            System.out.println("state totals recent subtask " + s + " entries " + p[0]);
        }
    }
}
