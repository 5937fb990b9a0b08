// A real RocksJava application for the `ckptfs import` integration tests: it writes to a
// live RocksDB and, while the writer keeps going, makes N checkpoints with
// org.rocksdb.Checkpoint, the way Flink's RocksDB state backend does. For each checkpoint it
// records what the checkpoint holds, read back through RocksDB itself, as the model a test
// compares ckptfs's imported copy with.
//
// Build and run (the RocksJava classes and native library, FRocksDB 8.10, are inside
// flink-dist-*.jar; scripts/env.sh's ckptfs_install_flink_jars sets CKPTFS_FLINK_LIB):
//
//   javac -cp "$CKPTFS_FLINK_LIB/*" -d CLASSDIR tests/java/RocksCheckpoints.java
//   java -cp "$CKPTFS_FLINK_LIB/*:CLASSDIR" RocksCheckpoints DB_DIR OUT_DIR N KEYS_PER_ROUND \
//        [--hold SECONDS] [--auto-compaction]
//
// The DB has a 256 KiB write buffer (several flushes, so several SSTs, per round) and
// automatic compaction off, so that no SST is ever deleted: each checkpoint hard-links every
// SST of the one before (same inodes) plus new ones, deterministically. With
// --auto-compaction, RocksDB's default compaction runs too, as in a real application; then
// whether consecutive checkpoints share SSTs depends on timing.
//
// Output: OUT_DIR/cp-1 .. OUT_DIR/cp-N, each a RocksDB checkpoint directory (CURRENT,
// MANIFEST-*, OPTIONS-*, *.sst, maybe *.log), and OUT_DIR/cp-i.keys, one line per live key
// of cp-i in key order: "hex(key) hex(value)" (lower-case hex). On stdout: "cp i KEYS" per
// checkpoint, then "done N". With --hold SECONDS it then prints "holding" and keeps DB_DIR
// open (its LOCK held) for SECONDS before closing. Any error: a message on stderr, exit 1.

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.HexFormat;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.rocksdb.Checkpoint;
import org.rocksdb.InfoLogLevel;
import org.rocksdb.Logger;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksDBException;
import org.rocksdb.RocksIterator;
import org.rocksdb.WriteOptions;

public final class RocksCheckpoints {
    private static final HexFormat HEX = HexFormat.of();
    private static final String ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

    /** The writer: a deterministic sequence of puts, overwrites and deletes. */
    private static final class Writer implements Runnable {
        private final RocksDB db;
        final AtomicLong writes = new AtomicLong();
        /** The writer may go on until it has done this many writes, then waits for more. */
        final AtomicLong allowance = new AtomicLong();
        volatile int round;
        volatile boolean stop;
        final AtomicReference<Throwable> failure = new AtomicReference<>();

        Writer(RocksDB db) {
            this.db = db;
        }

        @Override
        public void run() {
            Random rnd = new Random(0x636b707466734cL);
            long nextNew = 0; // keys key-00000000 .. key-(nextNew-1) have been written once
            try (WriteOptions wo = new WriteOptions()) {
                while (!stop) {
                    long seq = writes.get();
                    if (seq >= allowance.get()) {
                        synchronized (this) {
                            if (!stop && writes.get() >= allowance.get()) {
                                wait(5);
                            }
                        }
                        continue;
                    }
                    int op = rnd.nextInt(10);
                    long idx;
                    if (op < 7 || nextNew < 10) {
                        idx = nextNew++; // a new key
                    } else {
                        idx = (long) (rnd.nextDouble() * nextNew); // an existing key
                    }
                    byte[] key = String.format("key-%08d", idx).getBytes(StandardCharsets.US_ASCII);
                    if (op == 9 && idx < nextNew - 1) {
                        db.delete(wo, key);
                    } else {
                        StringBuilder v = new StringBuilder(200);
                        v.append("round=").append(round).append(" seq=").append(seq).append(' ');
                        while (v.length() < 200) {
                            v.append(ALNUM.charAt(rnd.nextInt(ALNUM.length())));
                        }
                        db.put(wo, key, v.toString().getBytes(StandardCharsets.US_ASCII));
                    }
                    writes.incrementAndGet();
                }
            } catch (Throwable t) {
                failure.set(t);
            }
        }

        synchronized void allow(long n) {
            allowance.set(n);
            notifyAll();
        }
    }

    /** A logger that drops RocksDB's info log, so that opening a checkpoint read-only adds no LOG file to it. */
    private static final class QuietLogger extends Logger {
        QuietLogger(Options options) {
            super(options);
        }

        @Override
        protected void log(InfoLogLevel level, String msg) {
        }
    }

    public static void main(String[] args) {
        try {
            run(args);
            System.exit(0);
        } catch (Throwable t) {
            System.err.println("RocksCheckpoints: " + t);
            t.printStackTrace(System.err);
            System.exit(1);
        }
    }

    private static void usage(String why) {
        System.err.println("RocksCheckpoints: " + why);
        System.err.println("usage: RocksCheckpoints DB_DIR OUT_DIR N KEYS_PER_ROUND [--hold SECONDS] [--auto-compaction]");
        System.exit(2);
    }

    private static void run(String[] args) throws Exception {
        if (args.length < 4) {
            usage("wrong number of arguments");
        }
        String dbDir = args[0];
        Path outDir = Paths.get(args[1]).toAbsolutePath();
        int n = 0;
        long perRound = 0;
        long holdSeconds = -1;
        boolean autoCompaction = false;
        try {
            n = Integer.parseInt(args[2]);
            perRound = Long.parseLong(args[3]);
            for (int a = 4; a < args.length; a++) {
                if (args[a].equals("--hold") && a + 1 < args.length) {
                    holdSeconds = Long.parseLong(args[++a]);
                    if (holdSeconds < 0) {
                        usage("SECONDS must not be negative");
                    }
                } else if (args[a].equals("--auto-compaction")) {
                    autoCompaction = true;
                } else {
                    usage("unknown option " + args[a]);
                }
            }
        } catch (NumberFormatException e) {
            usage("not a number: " + e.getMessage());
        }
        if (n < 1 || perRound < 1) {
            usage("N and KEYS_PER_ROUND must be positive");
        }

        RocksDB.loadLibrary();
        Files.createDirectories(outDir);

        try (Options options = new Options()
                .setCreateIfMissing(true)
                .setWriteBufferSize(256 * 1024)
                .setDisableAutoCompactions(!autoCompaction);
             RocksDB db = RocksDB.open(options, dbDir)) {
            Writer writer = new Writer(db);
            writer.allow(perRound);
            Thread thread = new Thread(writer, "rocks-writer");
            thread.setDaemon(true);
            thread.start();
            try {
                for (int i = 1; i <= n; i++) {
                    // Wait for this round's writes, then let the writer go on into the next
                    // round's, so that it is writing while the checkpoint is made.
                    long target = (long) i * perRound;
                    while (writer.writes.get() < target) {
                        checkWriter(writer, thread);
                        Thread.sleep(1);
                    }
                    writer.round = i;
                    writer.allow(target + perRound);
                    Path cp = outDir.resolve("cp-" + i);
                    try (Checkpoint checkpoint = Checkpoint.create(db)) {
                        checkpoint.createCheckpoint(cp.toString());
                    }
                    long keys = dumpKeys(cp, outDir.resolve("cp-" + i + ".keys"));
                    System.out.println("cp " + i + " " + keys);
                    System.out.flush();
                    checkWriter(writer, thread);
                }
            } finally {
                writer.stop = true;
                writer.allow(Long.MAX_VALUE);
                thread.join();
            }
            if (writer.failure.get() != null) {
                throw new Exception("writer failed", writer.failure.get());
            }
            System.out.println("done " + n);
            System.out.flush();
            if (holdSeconds >= 0) {
                System.out.println("holding");
                System.out.flush();
                Thread.sleep(holdSeconds * 1000);
            }
        }
    }

    private static void checkWriter(Writer writer, Thread thread) throws Exception {
        if (writer.failure.get() != null) {
            throw new Exception("writer failed", writer.failure.get());
        }
        if (!thread.isAlive()) {
            throw new Exception("writer stopped");
        }
    }

    /** Opens checkpoint CP read-only and writes every key and value, in key order, to OUT. Returns the key count. */
    private static long dumpKeys(Path cp, Path out) throws RocksDBException, IOException {
        Path tmp = out.resolveSibling(out.getFileName() + ".tmp");
        long count = 0;
        try (Options options = new Options().setCreateIfMissing(false);
             QuietLogger logger = new QuietLogger(options)) {
            options.setLogger(logger);
            try (RocksDB ro = RocksDB.openReadOnly(options, cp.toString());
                 RocksIterator it = ro.newIterator();
                 BufferedWriter w = Files.newBufferedWriter(tmp, StandardCharsets.US_ASCII)) {
                for (it.seekToFirst(); it.isValid(); it.next()) {
                    w.write(HEX.formatHex(it.key()));
                    w.write(' ');
                    w.write(HEX.formatHex(it.value()));
                    w.write('\n');
                    count++;
                }
                it.status();
            }
        }
        Files.move(tmp, out, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        return count;
    }
}
