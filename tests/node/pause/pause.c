/*
 * pause: the sandbox process of every pod on tests/node's node (containerd's
 * sandbox_image), built here so that nothing is pulled. Like Kubernetes' own pause
 * (build/pause/linux/pause.c), it holds the pod's namespaces open by staying alive, reaps
 * the zombies it inherits as PID 1 of a pod that shares its PID namespace, and exits on
 * SIGINT or SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void reap(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction sa = {0};
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not PID 1\n");
	sa.sa_handler = stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	for (;;)
		pause();
}
