package dev.haltsql.peers;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.transport.Netty4Plugin;

/**
 * A single OpenSearch node on loopback for the elasticsearch audit sink tests
 * (haltsql/tests/audit_sinks.rs): OpenSearch's own server code from Maven
 * Central, with the Netty 4 HTTP transport loaded from the class path (the
 * distribution loads it as a module from its install folder instead).
 *
 * Usage: OpenSearchNode HOME_DIR HTTP_PORT TRANSPORT_PORT
 */
public final class OpenSearchNode {
    private static final class ClasspathNode extends Node {
        ClasspathNode(Settings settings) {
            super(
                InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), null, () -> "haltsql-test"),
                List.of(Netty4Plugin.class),
                true);
        }
    }

    public static void main(String[] args) throws Exception {
        Path home = Path.of(args[0]);
        Settings settings = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "haltsql-test")
            .put("node.name", "haltsql-test")
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            .put("transport.port", args[2])
            .put("discovery.type", "single-node")
            .put("http.type", "netty4")
            .put("transport.type", "netty4")
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .put("action.auto_create_index", true)
            .build();
        Node node = new ClasspathNode(settings);
        node.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
            } catch (Exception e) {
                // exiting anyway
            }
        }));
        System.out.println("opensearch node started on 127.0.0.1:" + args[1]);
        Thread.currentThread().join();
    }
}
