/*
 * The node's sandbox ("pause") process: it holds a pod's namespaces open,
 * reaps the zombies of containers that share its PID namespace, and exits
 * cleanly when the runtime stops the sandbox. Built static by
 * hack/cluster.sh and packed as the haltsql.local/pause image.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("haltsql pause 3.10");
    return 0;
  }
  if (getpid() != 1) {
    /* Outside a PID namespace there are no orphans of ours to reap. */
    fprintf(stderr, "pause: warning: not running as PID 1\n");
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
