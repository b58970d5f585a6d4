; ramsey.s - Ramsey fringes: two pi/2 pulses separated by a delay, the drive detuned by its NCO.
;
; Run with:  qlink sim firmware/ramsey.s --json ramsey.json
;
; The drive's NCO runs DETUNING away from the qubit (the simulation's qubit sits at 0 Hz in the
; drive's frame), so between the two pulses the drive's phase turns against the qubit's by
; 2 pi DETUNING tau: P(1) oscillates with tau at DETUNING (1 MHz: one fringe over the sweep of
; 0, 200, ..., 1000 ns). Each shot ends with a readout into r1 and active reset (a pi pulse at
; 0 Hz when it read 1). The JSON's measurements, in order, are SHOTS per delay.
;
; The pulses are short squares (32 samples, 128 ns), so that the detuning turns the drive little
; during a pulse; amplitude 0.6 makes each about a pi/2 rotation in the model's calibration (a
; pi pulse is 1_254_378 summed samples: 0.6 * 32767 * 32 is 0.50 pi).

.equ DRIVE, 0
.equ READOUT, 0
.equ HALF, 32               ; samples of each pi/2 pulse
.equ RESET, 64              ; samples of the reset pi pulse
.equ WINDOW, 25             ; readout window, cycles
.equ SHOTS, 8               ; shots per delay
.equ DETUNING, 1MHz

.envelope square, square, length=HALF, amp=1.0
.envelope gauss, gaussian, length=RESET, sigma=16, amp=1.0

        set r4, SHOTS            ; delay 0 ns
tau0:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero0        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next0
zero0: sync 32
next0: add r4, r4, -1
        bne r4, 0, tau0
        set r4, SHOTS            ; delay 200 ns
tau1:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        wait 200ns
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero1        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next1
zero1: sync 32
next1: add r4, r4, -1
        bne r4, 0, tau1
        set r4, SHOTS            ; delay 400 ns
tau2:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        wait 400ns
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero2        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next2
zero2: sync 32
next2: add r4, r4, -1
        bne r4, 0, tau2
        set r4, SHOTS            ; delay 600 ns
tau3:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        wait 600ns
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero3        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next3
zero3: sync 32
next3: add r4, r4, -1
        bne r4, 0, tau3
        set r4, SHOTS            ; delay 800 ns
tau4:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        wait 800ns
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero4        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next4
zero4: sync 32
next4: add r4, r4, -1
        bne r4, 0, tau4
        set r4, SHOTS            ; delay 1000 ns
tau5:  play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        wait 1000ns
        play DRIVE, square, amp=0.6, freq=DETUNING
        wait HALF
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero5        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait RESET
        jmp next5
zero5: sync 32
next5: add r4, r4, -1
        bne r4, 0, tau5
        end
