/*
 * A tiny static network checker packed as an image by tests/node_smoke.rs,
 * so the node tier can prove pod networking without any image from a registry.
 *
 *   netcheck serve PORT          answer every TCP connection with "hello from HOSTNAME\n"
 *   netcheck connect HOST PORT   connect, print the first line the peer sends (if any), exit 0
 *   netcheck connect-env         connect to $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
 *   netcheck version             print the version (a command for `kubectl exec`)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int parse_port(const char *s) {
  char *end;
  long port = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || port < 1 || port > 65535) {
    fprintf(stderr, "netcheck: bad port %s\n", s);
    exit(2);
  }
  return (int)port;
}

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static int serve(int port) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 16) < 0) {
    perror("netcheck: listen");
    return 1;
  }
  printf("netcheck: serving on port %d as %s\n", port, host);
  fflush(stdout);
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c < 0) continue;
    char line[300];
    int n = snprintf(line, sizeof line, "hello from %s\n", host);
    if (write(c, line, (size_t)n) < 0) perror("netcheck: write");
    close(c);
  }
}

static int connect_to(const char *host, int port) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    fprintf(stderr, "netcheck: not an IPv4 address: %s\n", host);
    return 2;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct timeval timeout = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
    fprintf(stderr, "netcheck: connect %s:%d: ", host, port);
    perror(NULL);
    return 1;
  }
  printf("netcheck: connected to %s:%d\n", host, port);
  char buf[300];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    printf("netcheck: received %s", buf);
  }
  fflush(stdout);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  if (argc == 2 && strcmp(argv[1], "version") == 0) {
    puts("netcheck 1");
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "serve") == 0) return serve(parse_port(argv[2]));
  if (argc == 4 && strcmp(argv[1], "connect") == 0) return connect_to(argv[2], parse_port(argv[3]));
  if (argc == 2 && strcmp(argv[1], "connect-env") == 0) {
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (host == NULL || port == NULL) {
      fputs("netcheck: KUBERNETES_SERVICE_HOST/PORT are not set\n", stderr);
      return 2;
    }
    return connect_to(host, parse_port(port));
  }
  fputs("usage: netcheck serve PORT | connect HOST PORT | connect-env | version\n", stderr);
  return 2;
}
